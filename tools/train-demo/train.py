"""Trains the demo pipeline (a tiny FLUX.1-architecture FluxPipeline) on the scenes of
scenes.py and saves it in the diffusers layout. See README.md beside this file.

Stages, all seeded:
  1. text side: the tokenizers and frozen text encoders of `diffuse make-tiny --arch flux`
     (seeded random weights), loaded with transformers; every caption is encoded once, as
     the pipeline encodes it (77 CLIP tokens pooled, max_sequence_length T5 tokens).
  2. the VAE (AutoencoderKL, 4x downsampling, 4 latent channels): the exact pooling
     autoencoder, its decoder optionally trained on the training scenes' images; then the
     latent shift and scale from the encoded scenes.
  3. the transformer (FluxTransformer2DModel without guidance embedding) with the
     rectified-flow objective: x_t = (1 - t) x_0 + t e, target e - x_0, t sampled uniformly
     and at the 4-step schedule's sigmas (1, 0.75, 0.5, 0.25); with --objective rollout
     (stage 2, from --init) also at the states the model's own 4 Euler steps reach, so 4
     steps without guidance give the picture.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline,
                       FluxTransformer2DModel)
from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402

MAX_SEQ = 64  # T5 tokens: the longest caption is 62 (the T5 vocabulary is mostly letters)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def text_side(diffuse, work):
    tiny = os.path.join(work, "tiny")
    subprocess.run([diffuse, "make-tiny", "--arch", "flux", tiny], check=True,
                   stdout=subprocess.DEVNULL)
    tok = CLIPTokenizer.from_pretrained(os.path.join(tiny, "tokenizer"))
    tok2 = T5Tokenizer.from_pretrained(os.path.join(tiny, "tokenizer_2"))
    te = CLIPTextModel.from_pretrained(os.path.join(tiny, "text_encoder")).eval()
    te2 = T5EncoderModel.from_pretrained(os.path.join(tiny, "text_encoder_2")).eval()
    return tiny, tok, tok2, te, te2


@torch.no_grad()
def encode_captions(pipe, captions, batch=64):
    embeds, pooled = [], []
    for i in range(0, len(captions), batch):
        e, p, _ = pipe.encode_prompt(captions[i:i + batch], prompt_2=None,
                                     max_sequence_length=MAX_SEQ)
        embeds.append(e.float())
        pooled.append(p.float())
    return torch.cat(embeds), torch.cat(pooled)


def images(scene_list):
    x = np.stack([scenes.render(s) for s in scene_list]).astype(np.float32)
    return torch.from_numpy(x / 127.5 - 1).permute(0, 3, 1, 2).contiguous()


BIG = 100.0  # the constant channels' magnitude
LIFT = 12.0  # the offset that keeps SiLU in its linear range


@torch.no_grad()
def pooling_vae(C=8):
    """An AutoencoderKL whose encoder's mean is the image average-pooled 4x4 (RGB in latent
    channels 0-2, channel 3 zero) and whose decoder repeats each latent pixel 4x4 (nearest
    upsampling). The starting point the VAE is fine-tuned from.

    Every ResnetBlock2D is the identity (conv2 zero); the downsamplers average 2x2 blocks,
    the upsamplers' convolutions copy their centre. The one nonlinear place is the final
    GroupNorm + SiLU of each half: with one group, channel 3 holding -(r + g + b) and four
    channels at +-BIG, the group's mean is exactly 0 and its deviation sigma is BIG / sqrt(2)
    to within 3e-4, so the norm divides by a constant; the norm's scale sigma and shift LIFT
    then put the colours where SiLU(z) = z to within 2e-4, and conv_out takes LIFT off.
    With C > 8 channels (in every block) the others start at zero and sigma is
    2 BIG / sqrt(C)."""
    vae = AutoencoderKL(in_channels=3, out_channels=3,
                        down_block_types=("DownEncoderBlock2D",) * 3,
                        up_block_types=("UpDecoderBlock2D",) * 3,
                        block_out_channels=(C,) * 3, layers_per_block=1, latent_channels=4,
                        norm_num_groups=1, sample_size=scenes.SIZE,
                        mid_block_add_attention=False)
    sigma = 2 * BIG / C ** 0.5

    def centre(conv, pairs, bias=None):
        conv.weight.zero_()
        conv.bias.zero_()
        k = conv.weight.shape[-1] // 2
        for o, i, w in pairs:
            conv.weight[o, i, k, k] = w
        if bias:
            for o, b in bias.items():
                conv.bias[o] = b

    def lift_in(conv, n_in):
        """conv_in: channels 0-2 copy the input, 3 is -(sum), 4-7 are +-BIG."""
        pairs = [(c, c, 1.0) for c in range(3)] + [(3, c, -1.0) for c in range(3)]
        centre(conv, pairs, {4: BIG, 5: BIG, 6: -BIG, 7: -BIG})

    def norm_out(gn):
        gn.weight.zero_()
        gn.bias.zero_()
        gn.weight[:3] = sigma
        gn.bias[:3] = LIFT

    identity = [(c, c, 1.0) for c in range(C)]
    for module in vae.modules():
        if module.__class__.__name__ == "ResnetBlock2D":
            module.conv2.weight.zero_()
            module.conv2.bias.zero_()
    enc, dec = vae.encoder, vae.decoder
    lift_in(enc.conv_in, 3)
    for block in enc.down_blocks:
        for d in block.downsamplers or []:
            d.conv.weight.zero_()
            d.conv.bias.zero_()
            for c in range(C):
                d.conv.weight[c, c, :2, :2] = 0.25
    norm_out(enc.conv_norm_out)
    centre(enc.conv_out, [(c, c, 1.0) for c in range(3)],
           {**{c: -LIFT for c in range(3)}, **{c: -30.0 for c in range(4, 8)}})
    centre(vae.quant_conv, [(c, c, 1.0) for c in range(8)])
    centre(vae.post_quant_conv, [(c, c, 1.0) for c in range(4)])
    lift_in(dec.conv_in, 4)
    for block in dec.up_blocks:
        for u in block.upsamplers or []:
            centre(u.conv, identity)
    norm_out(dec.conv_norm_out)
    centre(dec.conv_out, [(c, c, 1.0) for c in range(3)], {c: -LIFT for c in range(3)})
    return vae


def train_vae(x, steps, batch, lr, gen, channels=8):
    """The pooling VAE with its decoder (and post_quant_conv) trained to reconstruct the
    sharp scenes from the pooled latents: the encoder stays the exact 4x4 average pool, so
    the latents (and the transformer trained on them) do not depend on this stage."""
    vae = pooling_vae(channels)
    if steps == 0:
        return vae.eval()
    params = list(vae.decoder.parameters()) + list(vae.post_quant_conv.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps,
                                                pct_start=0.05)
    with torch.no_grad():
        z_all = torch.cat([vae.encode(x[i:i + 128]).latent_dist.mean
                           for i in range(0, len(x), 128)])
    t0 = time.time()
    crop = scenes.SIZE // 2  # the decoder is convolutional: train on quarter crops
    for step in range(steps):
        idx = torch.randint(0, x.shape[0], (batch,), generator=gen)
        oy, ox = (int(v) * 8 for v in torch.randint(0, (scenes.SIZE - crop) // 8 + 1, (2,),
                                                    generator=gen))
        xb = x[idx, :, oy:oy + crop, ox:ox + crop]
        zb = z_all[idx, :, oy // 4:(oy + crop) // 4, ox // 4:(ox + crop) // 4]
        rec = vae.decode(zb).sample
        loss = F.mse_loss(rec, xb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"vae step {step}/{steps} mse {loss.item():.5f} ({time.time() - t0:.0f} s)")
    return vae.eval()


def pack(z):
    b, c, h, w = z.shape
    return z.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(
        b, (h // 2) * (w // 2), c * 4)


def make_transformer(args):
    return FluxTransformer2DModel(patch_size=1, in_channels=16, out_channels=None,
                                  num_layers=args.double, num_single_layers=args.single,
                                  attention_head_dim=32, num_attention_heads=args.heads,
                                  joint_attention_dim=64, pooled_projection_dim=64,
                                  guidance_embeds=False, axes_dims_rope=(8, 12, 12))


SIGMAS = (1.0, 0.75, 0.5, 0.25)  # the 4-step schedule (shift 1, no dynamic shifting)


def rollout(tr, e, embeds, pooled, ids, k):
    """The model's own 4-step Euler trajectory from noise e, k steps of it (no gradient):
    the states sample 4 steps really visit, at sigma SIGMAS[k]."""
    x = e
    with torch.no_grad():
        for i in range(k):
            t = torch.full((e.shape[0],), SIGMAS[i])
            v = tr(hidden_states=x, encoder_hidden_states=embeds, pooled_projections=pooled,
                   timestep=t, img_ids=ids[0], txt_ids=ids[1], return_dict=False)[0]
            nxt = SIGMAS[i + 1] if i + 1 < len(SIGMAS) else 0.0
            x = x + (nxt - SIGMAS[i]) * v
    return x


def train_transformer(tr, lat, embeds, pooled, args, gen, save):
    """Rectified flow on three kinds of sample in each batch: t uniform (x_t on the straight
    line from x_0 to noise, target e - x_0, FLUX.1's objective), t on the 4-step grid the
    same way, and t on the grid with x_t the model's own rollout from noise (target
    (x_t - x_0) / t: the straight way from where sampling really is to the picture). The
    last kind distils the 4-step sampler into the model, schnell-style: a few Euler steps
    without guidance land on the caption's one picture."""
    n, s, c = lat.shape
    side = int(round(s ** 0.5))
    img_ids = torch.zeros(side, side, 3)
    img_ids[..., 1] = torch.arange(side)[:, None]
    img_ids[..., 2] = torch.arange(side)[None, :]
    ids = (img_ids.reshape(s, 3), torch.zeros(MAX_SEQ, 3))
    opt = torch.optim.AdamW(tr.parameters(), lr=args.lr, weight_decay=0.0)
    # Warm-up, constant, then (with --decay) a linear decay to 0 over that share of the steps.
    # Without decay the weights after k steps are those of a run with --steps k.
    decay_from = int(args.steps * (1 - args.decay))

    def lr_at(i):
        if i < args.warmup:
            return (i + 1) / args.warmup
        if i < decay_from:
            return 1.0
        return max(0.0, (args.steps - i) / max(1, args.steps - decay_from))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    grid = torch.tensor(SIGMAS)
    b = args.batch
    n_uni, n_roll = b // 4, b // 2  # the rest: the grid on the straight line
    t0 = time.time()
    ema = None
    avg = [p.detach().clone() for p in tr.parameters()]
    for step in range(args.steps):
        idx = torch.randint(0, n, (b,), generator=gen)
        x0, emb, pool = lat[idx], embeds[idx], pooled[idx]
        e = torch.randn(x0.shape, generator=gen)
        if args.objective == "line":  # half uniform, half on the grid, all on the line
            t = torch.rand(b, generator=gen)
            on_grid = torch.rand(b, generator=gen) < 0.5
            t = torch.where(on_grid, grid[torch.randint(0, 4, (b,), generator=gen)], t)
            xt = (1 - t[:, None, None]) * x0 + t[:, None, None] * e
        else:
            t = grid[torch.randint(0, 4, (b,), generator=gen)]
            t[:n_uni] = torch.rand(n_uni, generator=gen) * 0.999 + 0.001
            xt = (1 - t[:, None, None]) * x0 + t[:, None, None] * e
            # The rollout share: one k for all of it (1-3 model steps from its noise).
            k = int(torch.randint(1, 4, (1,), generator=gen))
            r = slice(b - n_roll, b)
            t[r] = SIGMAS[k]
            xt[r] = rollout(tr, e[r], emb[r], pool[r], ids, k)
        target = (xt - x0) / t[:, None, None]
        v = tr(hidden_states=xt, encoder_hidden_states=emb, pooled_projections=pool,
               timestep=t, img_ids=ids[0], txt_ids=ids[1], return_dict=False)[0]
        loss = F.mse_loss(v, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tr.parameters(), 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():  # the saved weights: their exponential moving average
            d = min(args.ema, (1 + step) / (10 + step))
            for a, p in zip(avg, tr.parameters()):
                a.mul_(d).add_(p, alpha=1 - d)
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 25 == 0 or step == args.steps - 1:
            log(f"transformer step {step}/{args.steps} loss {ema:.4f} lr "
                f"{sched.get_last_lr()[0]:.2e} ({time.time() - t0:.0f} s)")
        if (step + 1) % args.save_every == 0 or step == args.steps - 1:
            live = [p.detach().clone() for p in tr.parameters()]
            with torch.no_grad():
                for a, p in zip(avg, tr.parameters()):
                    p.copy_(a)
            save(step + 1)
            with torch.no_grad():
                for q, p in zip(live, tr.parameters()):
                    p.copy_(q)
    return tr.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the pipeline folder to write")
    ap.add_argument("--diffuse", default="build/bin/diffuse", help="the diffuse binary")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-every", type=int, default=100, help="transformer steps")
    ap.add_argument("--vae-steps", type=int, default=0)
    ap.add_argument("--vae-batch", type=int, default=16)
    ap.add_argument("--vae-lr", type=float, default=1e-3)
    ap.add_argument("--vae-channels", type=int, default=8, help="channels of every VAE block")
    ap.add_argument("--vae-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--objective", choices=("line", "rollout"), default="rollout",
                    help="line: t on the straight line only (stage 1); rollout: also the "
                         "model's own 4-step states (stage 2)")
    ap.add_argument("--init", help="a pipeline folder whose transformer to start from")
    ap.add_argument("--warmup", type=int, default=50, help="learning-rate warm-up steps")
    ap.add_argument("--ema", type=float, default=0.998,
                    help="the saved weights are their moving average with this decay; 0: the "
                         "weights themselves")
    ap.add_argument("--decay", type=float, default=0.0,
                    help="the share of the steps over which the learning rate falls to 0")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--double", type=int, default=1)
    ap.add_argument("--single", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)  # the transformer's batches and noise
    gen_vae = torch.Generator().manual_seed(args.vae_seed + 1)  # the VAE's crops
    t_start = time.time()

    all_scenes = scenes.scene_list()
    train = [s for s in all_scenes if not scenes.held_out(s)]
    log(f"{len(all_scenes)} scenes, {len(train)} for training")

    with tempfile.TemporaryDirectory() as work:
        tiny, tok, tok2, te, te2 = text_side(args.diffuse, work)
        sched = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(tiny, "scheduler"))
        x = images(train)
        log("training the VAE")
        with torch.random.fork_rng():  # the VAE's initialisation apart from the transformer's
            torch.manual_seed(args.vae_seed)
            vae = train_vae(x, args.vae_steps, args.vae_batch, args.vae_lr, gen_vae,
                            args.vae_channels)
        with torch.no_grad():
            z = torch.cat([vae.encode(x[i:i + 128]).latent_dist.mean
                           for i in range(0, len(x), 128)])
        shift, scale = z.mean().item(), 1.0 / z.std().item()
        vae.register_to_config(shift_factor=shift, scaling_factor=scale)
        log(f"latents {tuple(z.shape)}: shift {shift:.4f} scale {scale:.4f}")
        lat = pack((z - shift) * scale)

        tr = make_transformer(args)
        if args.init:
            start = FluxTransformer2DModel.from_pretrained(os.path.join(args.init, "transformer"))
            tr.load_state_dict(start.state_dict())
            log(f"transformer from {args.init}")
        pipe = FluxPipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok,
                            text_encoder_2=te2, tokenizer_2=tok2, transformer=tr)
        embeds, pooled = encode_captions(pipe, [scenes.caption(s) for s in train])
        log(f"encoded {len(train)} captions; transformer "
            f"{sum(p.numel() for p in tr.parameters())} parameters")

        def save(steps):
            if os.path.exists(args.out):
                shutil.rmtree(args.out)
            pipe.save_pretrained(args.out, safe_serialization=True)
            # The tokenizers exactly as the project writes them (the C tokenizers read them).
            for folder in ("tokenizer", "tokenizer_2"):
                shutil.rmtree(os.path.join(args.out, folder))
                shutil.copytree(os.path.join(tiny, folder), os.path.join(args.out, folder))
            # T5 takes MAX_SEQ tokens by default (diffuse reads model_max_length for it).
            cfg = os.path.join(args.out, "tokenizer_2", "tokenizer_config.json")
            with open(cfg) as f:
                text = f.read()
            assert '"model_max_length": 512' in text, cfg
            with open(cfg, "w") as f:
                f.write(text.replace('"model_max_length": 512', f'"model_max_length": {MAX_SEQ}'))
            record = dict(vars(args), out=None, steps_done=steps,
                          seconds=round(time.time() - t_start), torch=torch.__version__,
                          max_sequence_length=MAX_SEQ)
            with open(os.path.join(args.out, "training.json"), "w") as f:
                json.dump(record, f, indent=1)
            log(f"wrote {args.out} after {steps} transformer steps, "
                f"{time.time() - t_start:.0f} s in all")

        if args.steps == 0:  # the VAE stage alone: the transformer as --init gave it
            save(0)
        else:
            train_transformer(tr, lat, embeds, pooled, args, gen, save)


if __name__ == "__main__":
    main()
