/*
 * FLUX.1 transformer names: Black Forest Labs' original checkpoint layout (flux1-dev.
 * safetensors, city96's GGUFs) mapped to diffusers' FluxTransformer2DModel names, as
 * diffusers' single-file conversion (convert_flux_transformer_checkpoint_to_diffusers)
 * does it, but as a lookup instead of a conversion pass.
 *
 * A diffusers tensor is found as one source tensor or a block of its rows: the fused
 * attention projection (qkv, rows [q; k; v]) gives to_q / to_k / to_v as thirds; a single
 * block's linear1 (rows [q; k; v; mlp], mlp = 4 x inner) gives them as sevenths; the final
 * layer's adaLN stores [shift; scale] where diffusers has [scale; shift], so norm_out is the
 * second half then the first. The loader binds a single block of rows as a view of the
 * file; the swapped halves are read into memory. QK norms are named ".scale" there.
 *
 * The layout is recognised from the keys: "double_blocks.0.img_attn.qkv.weight" under some
 * prefix (none for BFL's and city96's files, "model.diffusion_model." for ComfyUI's). dev
 * and schnell differ by guidance_in (guidance_embeds), which the config decides.
 */
#include "models/names.h"

#include <diffuse/flux.h>

#include "core/status.h"
#include "models/single_file.h"

#include <stdio.h>
#include <string.h>

/* What FLUX.2's layout keeps of FLUX.1's: the double blocks' fused qkv (thirds), QK norms and
 * output projections, the single blocks' QK norms and the final layer. */
static const df_name_rule shared_rules[] = {
    {"transformer_blocks.*.attn.to_q.", "double_blocks.*.img_attn.qkv.", DF_NAME_THIRD(0)},
    {"transformer_blocks.*.attn.to_k.", "double_blocks.*.img_attn.qkv.", DF_NAME_THIRD(1)},
    {"transformer_blocks.*.attn.to_v.", "double_blocks.*.img_attn.qkv.", DF_NAME_THIRD(2)},
    {"transformer_blocks.*.attn.add_q_proj.", "double_blocks.*.txt_attn.qkv.", DF_NAME_THIRD(0)},
    {"transformer_blocks.*.attn.add_k_proj.", "double_blocks.*.txt_attn.qkv.", DF_NAME_THIRD(1)},
    {"transformer_blocks.*.attn.add_v_proj.", "double_blocks.*.txt_attn.qkv.", DF_NAME_THIRD(2)},
    {"transformer_blocks.*.attn.norm_q.weight", "double_blocks.*.img_attn.norm.query_norm.scale",
     DF_NAME_WHOLE},
    {"transformer_blocks.*.attn.norm_k.weight", "double_blocks.*.img_attn.norm.key_norm.scale",
     DF_NAME_WHOLE},
    {"transformer_blocks.*.attn.norm_added_q.weight",
     "double_blocks.*.txt_attn.norm.query_norm.scale", DF_NAME_WHOLE},
    {"transformer_blocks.*.attn.norm_added_k.weight",
     "double_blocks.*.txt_attn.norm.key_norm.scale", DF_NAME_WHOLE},
    {"transformer_blocks.*.attn.to_out.0.", "double_blocks.*.img_attn.proj.", DF_NAME_WHOLE},
    {"transformer_blocks.*.attn.to_add_out.", "double_blocks.*.txt_attn.proj.", DF_NAME_WHOLE},
    {"single_transformer_blocks.*.attn.norm_q.weight", "single_blocks.*.norm.query_norm.scale",
     DF_NAME_WHOLE},
    {"single_transformer_blocks.*.attn.norm_k.weight", "single_blocks.*.norm.key_norm.scale",
     DF_NAME_WHOLE},
    {"norm_out.linear.", "final_layer.adaLN_modulation.1.", DF_NAME_SWAPPED},
    {"proj_out.", "final_layer.linear.", DF_NAME_WHOLE},
};

/* FLUX.1's own: biases, the separate modulations and MLPs, linear1 in sevenths. */
static const df_name_rule rules[] = {
    {"x_embedder.weight", "img_in.weight", DF_NAME_WHOLE},
    {"x_embedder.bias", "img_in.bias", DF_NAME_WHOLE},
    {"context_embedder.weight", "txt_in.weight", DF_NAME_WHOLE},
    {"context_embedder.bias", "txt_in.bias", DF_NAME_WHOLE},
    {"time_text_embed.timestep_embedder.linear_1.", "time_in.in_layer.", DF_NAME_WHOLE},
    {"time_text_embed.timestep_embedder.linear_2.", "time_in.out_layer.", DF_NAME_WHOLE},
    {"time_text_embed.guidance_embedder.linear_1.", "guidance_in.in_layer.", DF_NAME_WHOLE},
    {"time_text_embed.guidance_embedder.linear_2.", "guidance_in.out_layer.", DF_NAME_WHOLE},
    {"time_text_embed.text_embedder.linear_1.", "vector_in.in_layer.", DF_NAME_WHOLE},
    {"time_text_embed.text_embedder.linear_2.", "vector_in.out_layer.", DF_NAME_WHOLE},
    {"transformer_blocks.*.norm1.linear.", "double_blocks.*.img_mod.lin.", DF_NAME_WHOLE},
    {"transformer_blocks.*.norm1_context.linear.", "double_blocks.*.txt_mod.lin.", DF_NAME_WHOLE},
    {"transformer_blocks.*.ff.net.0.proj.", "double_blocks.*.img_mlp.0.", DF_NAME_WHOLE},
    {"transformer_blocks.*.ff.net.2.", "double_blocks.*.img_mlp.2.", DF_NAME_WHOLE},
    {"transformer_blocks.*.ff_context.net.0.proj.", "double_blocks.*.txt_mlp.0.", DF_NAME_WHOLE},
    {"transformer_blocks.*.ff_context.net.2.", "double_blocks.*.txt_mlp.2.", DF_NAME_WHOLE},
    {"single_transformer_blocks.*.norm.linear.", "single_blocks.*.modulation.lin.", DF_NAME_WHOLE},
    {"single_transformer_blocks.*.attn.to_q.", "single_blocks.*.linear1.", 7, 1, {{0, 1}}},
    {"single_transformer_blocks.*.attn.to_k.", "single_blocks.*.linear1.", 7, 1, {{1, 2}}},
    {"single_transformer_blocks.*.attn.to_v.", "single_blocks.*.linear1.", 7, 1, {{2, 3}}},
    {"single_transformer_blocks.*.proj_mlp.", "single_blocks.*.linear1.", 7, 1, {{3, 7}}},
    {"single_transformer_blocks.*.proj_out.", "single_blocks.*.linear2.", DF_NAME_WHOLE},
};

bool df_names_flux_bfl(const char *diffusers, int arg, df_name_src *out)
{
    (void)arg;
    return df_names_lookup(rules, sizeof rules / sizeof rules[0], diffusers, out) ||
           df_names_flux_bfl_shared(diffusers, out);
}

bool df_names_flux_bfl_shared(const char *diffusers, df_name_src *out)
{
    return df_names_lookup(shared_rules, sizeof shared_rules / sizeof shared_rules[0], diffusers,
                           out);
}

const char *df_names_flux_probe(void)
{
    return "double_blocks.0.img_attn.qkv.weight";
}

/* Blocks whose probe tensor exists: 0, 1, ... until one is missing. */
static int count_blocks(const df_single_file *sf, const char *fmt)
{
    int n = 0;
    char name[128];
    for (;; n++) {
        snprintf(name, sizeof name, fmt, n);
        if (!df_single_file_has(sf, name))
            return n;
    }
}

df_status df_flux_describe_file(const char *path, char *out, size_t cap, bool *found)
{
    *found = false;
    if (cap)
        out[0] = '\0';
    df_single_file *sf;
    DF_TRY(df_single_file_open(path, "inspect", df_names_flux_bfl, 0, df_names_flux_probe(), &sf));
    if (!df_single_file_mapped(sf)) {
        snprintf(out, cap,
                 "not a FLUX.1 transformer in Black Forest Labs' layout (no tensor "
                 "named '[prefix]%s')",
                 df_names_flux_probe());
        df_single_file_free(sf);
        return DF_OK;
    }
    const char *prefix = df_single_file_prefix(sf);
    bool dev = df_single_file_has(sf, "time_text_embed.guidance_embedder.linear_1.weight");
    int nd = count_blocks(sf, "transformer_blocks.%d.norm1.linear.weight");
    int ns = count_blocks(sf, "single_transformer_blocks.%d.norm.linear.weight");
    if (nd == 0 && ns == 0) { /* FLUX.2's blocks share FLUX.1's names but not its modulation */
        snprintf(out, cap,
                 "not a FLUX.1 transformer (BFL's block names under '%s', but no block "
                 "modulation: FLUX.2's layout)",
                 prefix);
        df_single_file_free(sf);
        return DF_OK;
    }
    snprintf(out, cap,
             "FLUX.1 transformer in Black Forest Labs' layout (%s%s%s), %s, %d "
             "double + %d single blocks",
             *prefix ? "prefix '" : "no prefix", prefix, *prefix ? "'" : "",
             dev ? "dev (guidance_in: guidance_embeds true)"
                 : "schnell (no guidance_in: guidance_embeds false)",
             nd, ns);
    *found = true;
    df_single_file_free(sf);
    return DF_OK;
}
