/*
 * FLUX.2 transformer names: Black Forest Labs' original FLUX.2 checkpoints (flux2-dev.
 * safetensors, the klein files, under "model.diffusion_model." in ComfyUI's) mapped to
 * diffusers' Flux2Transformer2DModel names, as diffusers'
 * convert_flux2_transformer_checkpoint_to_diffusers does, as a lookup.
 *
 * The layout is FLUX.1's with shared modulations (double_stream_modulation_img / _txt,
 * single_stream_modulation: ".lin" there, ".linear" in diffusers) and no biases: the double
 * blocks' fused qkv gives to_q / to_k / to_v and add_*_proj as thirds; a single block's
 * linear1 is diffusers' fused to_qkv_mlp_proj as it is; the final layer's [shift; scale] is
 * read swapped. Recognised by single_stream_modulation.lin.weight.
 */
#include "models/names.h"

/* FLUX.2's own rules; the rest are FLUX.1's (df_names_flux_bfl_shared). */
static const df_name_rule rules[] = {
    {"x_embedder.", "img_in.", DF_NAME_WHOLE},
    {"context_embedder.", "txt_in.", DF_NAME_WHOLE},
    {"time_guidance_embed.timestep_embedder.linear_1.", "time_in.in_layer.", DF_NAME_WHOLE},
    {"time_guidance_embed.timestep_embedder.linear_2.", "time_in.out_layer.", DF_NAME_WHOLE},
    {"time_guidance_embed.guidance_embedder.linear_1.", "guidance_in.in_layer.", DF_NAME_WHOLE},
    {"time_guidance_embed.guidance_embedder.linear_2.", "guidance_in.out_layer.", DF_NAME_WHOLE},
    {"double_stream_modulation_img.linear.", "double_stream_modulation_img.lin.", DF_NAME_WHOLE},
    {"double_stream_modulation_txt.linear.", "double_stream_modulation_txt.lin.", DF_NAME_WHOLE},
    {"single_stream_modulation.linear.", "single_stream_modulation.lin.", DF_NAME_WHOLE},
    {"transformer_blocks.*.ff.linear_in.", "double_blocks.*.img_mlp.0.", DF_NAME_WHOLE},
    {"transformer_blocks.*.ff.linear_out.", "double_blocks.*.img_mlp.2.", DF_NAME_WHOLE},
    {"transformer_blocks.*.ff_context.linear_in.", "double_blocks.*.txt_mlp.0.", DF_NAME_WHOLE},
    {"transformer_blocks.*.ff_context.linear_out.", "double_blocks.*.txt_mlp.2.", DF_NAME_WHOLE},
    {"single_transformer_blocks.*.attn.to_qkv_mlp_proj.", "single_blocks.*.linear1.",
     DF_NAME_WHOLE},
    {"single_transformer_blocks.*.attn.to_out.", "single_blocks.*.linear2.", DF_NAME_WHOLE},
};

bool df_names_flux2_bfl(const char *diffusers, int arg, df_name_src *out)
{
    (void)arg;
    return df_names_lookup(rules, sizeof rules / sizeof rules[0], diffusers, out) ||
           df_names_flux_bfl_shared(diffusers, out);
}

const char *df_names_flux2_probe(void)
{
    return "single_stream_modulation.lin.weight";
}
