/*
 * AutoencoderKL names in the original layout: the LDM / CompVis names that Black Forest
 * Labs' ae.safetensors, SD3's VAE and ComfyUI's all-in-one files (under "vae." or
 * "first_stage_model.") use, mapped to diffusers' as diffusers' single-file conversion
 * (convert_ldm_vae_checkpoint) does, as a lookup.
 *
 *   encoder.down_blocks.i.resnets.j   encoder.down.i.block.j   (conv_shortcut: nin_shortcut)
 *   encoder.down_blocks.i.downsamplers.0.conv   encoder.down.i.downsample.conv
 *   decoder.up_blocks.k.resnets.j     decoder.up.(N-1-k).block.j   (LDM counts up blocks from
 *   decoder.up_blocks.k.upsamplers.0.conv       decoder.up.(N-1-k).upsample.conv  the bottom)
 *   *.mid_block.resnets.0 / 1          *.mid.block_1 / block_2
 *   *.mid_block.attentions.0.group_norm / to_q / to_k / to_v / to_out.0
 *                                      *.mid.attn_1.norm / q / k / v / proj_out
 *   *.conv_norm_out                    *.norm_out
 *
 * conv_in, conv_out, quant_conv and post_quant_conv keep their names, except in Black Forest
 * Labs' FLUX.2 ae.safetensors (AutoencoderKLFlux2), which nests them in their halves
 * (encoder.quant_conv, decoder.post_quant_conv: arg carries DF_NAMES_VAE_NESTED_QUANT) and
 * adds the latent batch norm under diffusers' own names (bn.running_mean, bn.running_var,
 * bn.num_batches_tracked). The attention's
 * projections are 1x1 convolutions there ([C, C, 1, 1]); the loader takes them as the
 * [C, C] linears diffusers squeezes them into (single_file.c accepts trailing 1s).
 */
#include "models/names.h"

#include <stdio.h>
#include <string.h>

/* "weight" / "bias" after `prefix`: *rest points at it. */
static bool tail(const char *name, const char *prefix, const char **rest)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0)
        return false;
    *rest = name + n;
    return strcmp(*rest, "weight") == 0 || strcmp(*rest, "bias") == 0;
}

/* A resnet's own part ("norm1.weight", "conv_shortcut.bias") in LDM's words. */
static bool resnet_part(const char *part, char *out, size_t cap)
{
    static const char *const same[] = {"norm1.", "conv1.", "norm2.", "conv2."};
    const char *rest;
    for (size_t i = 0; i < sizeof same / sizeof *same; i++)
        if (tail(part, same[i], &rest))
            return (size_t)snprintf(out, cap, "%s%s", same[i], rest) < cap;
    if (tail(part, "conv_shortcut.", &rest))
        return (size_t)snprintf(out, cap, "nin_shortcut.%s", rest) < cap;
    return false;
}

/* The mid block's part ("resnets.1.conv2.weight", "attentions.0.to_q.bias"). */
static bool mid_part(const char *part, char *out, size_t cap)
{
    static const char *const attn[][2] = {{"group_norm.", "norm."},
                                          {"to_q.", "q."},
                                          {"to_k.", "k."},
                                          {"to_v.", "v."},
                                          {"to_out.0.", "proj_out."}};
    char sub[128];
    const char *rest;
    if (strncmp(part, "resnets.0.", 10) == 0 || strncmp(part, "resnets.1.", 10) == 0) {
        if (!resnet_part(part + 10, sub, sizeof sub))
            return false;
        return (size_t)snprintf(out, cap, "block_%c.%s", part[8] == '0' ? '1' : '2', sub) < cap;
    }
    if (strncmp(part, "attentions.0.", 13) != 0)
        return false;
    for (size_t i = 0; i < sizeof attn / sizeof *attn; i++)
        if (tail(part + 13, attn[i][0], &rest))
            return (size_t)snprintf(out, cap, "attn_1.%s%s", attn[i][1], rest) < cap;
    return false;
}

/* "<i>.<word>.<j>." at *p: reads i (and j when `two`), advances *p past them. */
static bool indices(const char **p, const char *word, bool two, int *i, int *j)
{
    int n = 0;
    if (two) {
        char fmt[64];
        snprintf(fmt, sizeof fmt, "%%d.%s.%%d.%%n", word);
        if (sscanf(*p, fmt, i, j, &n) != 2 || n == 0)
            return false;
    } else if (sscanf(*p, "%d.%n", i, &n) != 1 || n == 0) {
        return false;
    }
    if (**p < '0' || **p > '9' || *i < 0 || (two && *j < 0))
        return false;
    *p += n;
    return true;
}

bool df_names_vae_ldm(const char *diffusers, int arg, df_name_src *out)
{
    memset(out, 0, sizeof *out);
    out->units = out->n = 1;
    out->part[0][1] = 1;
    char *dst = out->name;
    size_t cap = sizeof out->name;
    char part[160];
    const char *half = strncmp(diffusers, "encoder.", 8) == 0   ? "encoder"
                       : strncmp(diffusers, "decoder.", 8) == 0 ? "decoder"
                                                                : NULL;
    bool nested = (arg & DF_NAMES_VAE_NESTED_QUANT) != 0;
    arg &= ~DF_NAMES_VAE_NESTED_QUANT;
    if (nested && strncmp(diffusers, "quant_conv.", 11) == 0)
        return (size_t)snprintf(dst, cap, "encoder.%s", diffusers) < cap;
    if (nested && strncmp(diffusers, "post_quant_conv.", 16) == 0)
        return (size_t)snprintf(dst, cap, "decoder.%s", diffusers) < cap;
    if (!half) /* quant_conv, post_quant_conv, FLUX.2's bn.* */
        return (size_t)snprintf(dst, cap, "%s", diffusers) < cap;
    const char *p = diffusers + 8;
    int i, j;
    const char *rest;
    if (strncmp(p, "mid_block.", 10) == 0)
        return mid_part(p + 10, part, sizeof part) &&
               (size_t)snprintf(dst, cap, "%s.mid.%s", half, part) < cap;
    if (tail(p, "conv_norm_out.", &rest))
        return (size_t)snprintf(dst, cap, "%s.norm_out.%s", half, rest) < cap;
    if (tail(p, "conv_in.", &rest) || tail(p, "conv_out.", &rest))
        return (size_t)snprintf(dst, cap, "%s", diffusers) < cap;
    bool enc = half[0] == 'e';
    const char *blocks = enc ? "down_blocks." : "up_blocks.";
    if (strncmp(p, blocks, strlen(blocks)) != 0)
        return false;
    p += strlen(blocks);
    const char *q = p;
    if (indices(&q, "resnets", true, &i, &j)) {
        if (!enc && i >= arg)
            return false;
        return resnet_part(q, part, sizeof part) &&
               (size_t)snprintf(dst, cap, "%s.%s.%d.block.%d.%s", half, enc ? "down" : "up",
                                enc ? i : arg - 1 - i, j, part) < cap;
    }
    q = p;
    if (!indices(&q, "", false, &i, &j) || (!enc && i >= arg))
        return false;
    if (tail(q, enc ? "downsamplers.0.conv." : "upsamplers.0.conv.", &rest))
        return (size_t)snprintf(dst, cap, "%s.%s.%d.%s.conv.%s", half, enc ? "down" : "up",
                                enc ? i : arg - 1 - i, enc ? "downsample" : "upsample", rest) < cap;
    return false;
}

const char *df_names_vae_probe(void)
{
    return "decoder.mid.block_1.conv1.weight";
}

const char *df_names_vae_flux2_probe(void)
{
    return "bn.running_mean";
}
