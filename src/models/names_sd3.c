/*
 * SD3 / SD3.5 transformer names: Stability AI's original MMDiT checkpoints
 * (sd3.5_large.safetensors, sd3_medium.safetensors, under "model.diffusion_model." in the
 * all-in-one files) mapped to diffusers' SD3Transformer2DModel names, as diffusers'
 * convert_sd3_transformer_checkpoint_to_diffusers does, as a lookup.
 *
 * Each joint block has an x_block (the image stream) and a context_block (the text
 * stream); their fused attn.qkv gives to_q / to_k / to_v and add_q_proj / add_k_proj /
 * add_v_proj as thirds, x_block.attn2 (SD3.5 medium's dual attention) gives attn2's. The
 * last block's context modulation ([shift; scale], its only two chunks) and the final
 * layer's are swapped, as in FLUX.1; the last block has no context projection or MLP.
 */
#include "models/names.h"

#include <stdio.h>
#include <string.h>

static const df_name_rule rules[] = {
    {"pos_embed.pos_embed", "pos_embed", DF_NAME_WHOLE},
    {"pos_embed.proj.", "x_embedder.proj.", DF_NAME_WHOLE},
    {"time_text_embed.timestep_embedder.linear_1.", "t_embedder.mlp.0.", DF_NAME_WHOLE},
    {"time_text_embed.timestep_embedder.linear_2.", "t_embedder.mlp.2.", DF_NAME_WHOLE},
    {"time_text_embed.text_embedder.linear_1.", "y_embedder.mlp.0.", DF_NAME_WHOLE},
    {"time_text_embed.text_embedder.linear_2.", "y_embedder.mlp.2.", DF_NAME_WHOLE},
    {"context_embedder.", "context_embedder.", DF_NAME_WHOLE},
    {"transformer_blocks.*.attn.to_q.", "joint_blocks.*.x_block.attn.qkv.", DF_NAME_THIRD(0)},
    {"transformer_blocks.*.attn.to_k.", "joint_blocks.*.x_block.attn.qkv.", DF_NAME_THIRD(1)},
    {"transformer_blocks.*.attn.to_v.", "joint_blocks.*.x_block.attn.qkv.", DF_NAME_THIRD(2)},
    {"transformer_blocks.*.attn.add_q_proj.", "joint_blocks.*.context_block.attn.qkv.",
     DF_NAME_THIRD(0)},
    {"transformer_blocks.*.attn.add_k_proj.", "joint_blocks.*.context_block.attn.qkv.",
     DF_NAME_THIRD(1)},
    {"transformer_blocks.*.attn.add_v_proj.", "joint_blocks.*.context_block.attn.qkv.",
     DF_NAME_THIRD(2)},
    {"transformer_blocks.*.attn.norm_q.weight", "joint_blocks.*.x_block.attn.ln_q.weight",
     DF_NAME_WHOLE},
    {"transformer_blocks.*.attn.norm_k.weight", "joint_blocks.*.x_block.attn.ln_k.weight",
     DF_NAME_WHOLE},
    {"transformer_blocks.*.attn.norm_added_q.weight",
     "joint_blocks.*.context_block.attn.ln_q.weight", DF_NAME_WHOLE},
    {"transformer_blocks.*.attn.norm_added_k.weight",
     "joint_blocks.*.context_block.attn.ln_k.weight", DF_NAME_WHOLE},
    {"transformer_blocks.*.attn.to_out.0.", "joint_blocks.*.x_block.attn.proj.", DF_NAME_WHOLE},
    {"transformer_blocks.*.attn.to_add_out.", "joint_blocks.*.context_block.attn.proj.",
     DF_NAME_WHOLE},
    {"transformer_blocks.*.attn2.to_q.", "joint_blocks.*.x_block.attn2.qkv.", DF_NAME_THIRD(0)},
    {"transformer_blocks.*.attn2.to_k.", "joint_blocks.*.x_block.attn2.qkv.", DF_NAME_THIRD(1)},
    {"transformer_blocks.*.attn2.to_v.", "joint_blocks.*.x_block.attn2.qkv.", DF_NAME_THIRD(2)},
    {"transformer_blocks.*.attn2.norm_q.weight", "joint_blocks.*.x_block.attn2.ln_q.weight",
     DF_NAME_WHOLE},
    {"transformer_blocks.*.attn2.norm_k.weight", "joint_blocks.*.x_block.attn2.ln_k.weight",
     DF_NAME_WHOLE},
    {"transformer_blocks.*.attn2.to_out.0.", "joint_blocks.*.x_block.attn2.proj.", DF_NAME_WHOLE},
    {"transformer_blocks.*.norm1.linear.", "joint_blocks.*.x_block.adaLN_modulation.1.",
     DF_NAME_WHOLE},
    {"transformer_blocks.*.norm1_context.linear.",
     "joint_blocks.*.context_block.adaLN_modulation.1.", DF_NAME_WHOLE},
    {"transformer_blocks.*.ff.net.0.proj.", "joint_blocks.*.x_block.mlp.fc1.", DF_NAME_WHOLE},
    {"transformer_blocks.*.ff.net.2.", "joint_blocks.*.x_block.mlp.fc2.", DF_NAME_WHOLE},
    {"transformer_blocks.*.ff_context.net.0.proj.", "joint_blocks.*.context_block.mlp.fc1.",
     DF_NAME_WHOLE},
    {"transformer_blocks.*.ff_context.net.2.", "joint_blocks.*.context_block.mlp.fc2.",
     DF_NAME_WHOLE},
    {"norm_out.linear.", "final_layer.adaLN_modulation.1.", DF_NAME_SWAPPED},
    {"proj_out.", "final_layer.linear.", DF_NAME_WHOLE},
};

bool df_names_sd3_mmdit(const char *diffusers, int arg, df_name_src *out)
{
    if (!df_names_lookup(rules, sizeof rules / sizeof rules[0], diffusers, out))
        return false;
    char last[96];
    snprintf(last, sizeof last, "transformer_blocks.%d.norm1_context.linear.", arg - 1);
    if (strncmp(diffusers, last, strlen(last)) == 0) { /* [shift; scale] there */
        out->units = out->n = 2;
        out->part[0][0] = 1, out->part[0][1] = 2;
        out->part[1][0] = 0, out->part[1][1] = 1;
    }
    return true;
}

const char *df_names_sd3_probe(void)
{
    return "joint_blocks.0.x_block.attn.qkv.weight";
}
