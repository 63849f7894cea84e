/*
 * Graph planning, shared by defer-and-fuse (lazy.c) and compiled mode (compile.c); the
 * plans run in graph_run.c.
 *
 * A plan for nodes[0..n):
 *   1. liveness: a node is needed if a tensor handle still sees its output or a needed node
 *      reads it; the rest is dropped without ever being allocated;
 *   2. fusion and rewrites, as far as the backend's kernels allow:
 *      - chains of pointwise ops (add, sub, mul, div, scale, activations, f32 copies) whose
 *        intermediate results nobody else reads become one kernel, and a layer/RMS norm
 *        feeding such a chain becomes its "head" (normalisation + AdaLN modulation in one
 *        pass);
 *      - an activation right after a matrix product, and the gated residual
 *        x + gate * linear(h), are applied by the product itself (GEMM post-ops); a
 *        product that ops.c already made gated (an unmerged LoRA's y + h up^T) keeps its
 *        epilogue: no activation folds into it and it writes f32;
 *      - RMS norm -> [concat ->] permute -> RoPE (q and k before attention) is one pass per
 *        part that writes the rotated rows where attention reads them;
 *      - a concat whose inputs nobody else reads has their producers write into it;
 *      - in bf16 compute, a result only bf16 products read is written in bf16;
 *   3. memory: outputs still seen by handles get their own buffers; every other
 *      intermediate gets an offset in one arena (the context's, reused by every graph),
 *      planned from the kernels' order so that buffers whose lifetimes do not overlap
 *      share memory.
 * A plan depends only on the graph's structure: ops, integer attributes, shapes, dtypes,
 * view layouts, which node feeds which input, which outputs are visible (the cache key,
 * df_graph_key). Data pointers and float attributes (timestep-dependent scales, eps) are
 * read from the nodes at every run, so the same denoising step, or the same block at
 * another depth, reuses the plan. Planning is a few linear passes over the graph, so it
 * runs inline: the first step pays microseconds, not a compile.
 */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "runtime/graph_plan_impl.h"

/* ---- structure hash -------------------------------------------------------------------- */

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0x100000001b3ull;
}

static uint64_t hash_view(uint64_t h, const df_gview *v)
{
    h = mix(h, (uint64_t)(v->st != NULL));
    if (!v->st)
        return h;
    h = mix(h, (uint64_t)(int64_t)producer_of(v));
    h = mix(h, (uint64_t)v->dtype);
    h = mix(h, (uint64_t)v->ndim);
    h = mix(h, (uint64_t)v->offset);
    for (int d = 0; d < v->ndim; d++)
        h = mix(mix(h, (uint64_t)v->shape[d]), (uint64_t)v->stride[d]);
    return h;
}

/* The attributes that shape a program: every int attribute (real ones are read from the
 * live nodes when a program runs, so a new eps or scale needs no new program). */
static uint64_t mix_int(uint64_t h, int64_t v)
{
    return mix(h, (uint64_t)v);
}

static uint64_t mix_real(uint64_t h, double v)
{
    (void)v;
    return h;
}

static uint64_t mix_axes(uint64_t h, const int64_t *v)
{
    for (int k = 0; k < DF_ATTR_MAX_AXES; k++)
        h = mix(h, (uint64_t)v[k]);
    return h;
}

static uint64_t hash_attrs(uint64_t h, const df_attrs *a)
{
#define DF_ATTR(type, name, doc) h = mix_##type(h, a->name);
#include "backend/ops.def"
#undef DF_ATTR
    return h;
}

uint64_t df_graph_key(df_gnode *const *nodes, int n)
{
    uint64_t h = mix(0xcbf29ce484222325ull, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        const df_gnode *x = nodes[i];
        h = mix(h, (uint64_t)x->op);
        h = hash_attrs(h, &x->a);
        h = mix(h, (uint64_t)(x->out.st->handles > 0));
        h = hash_view(h, &x->out);
        for (int k = 0; k < x->n_in; k++)
            h = hash_view(h, &x->in[k]);
    }
    return h;
}

bool df_graph_append(df_gnode ***nodes, int *n, int *cap, df_gnode *node)
{
    if (*n == *cap) {
        int grown = *cap ? 2 * *cap : 256;
        df_gnode **nn = df_realloc(*nodes, (size_t)grown * sizeof *nn);
        if (!nn)
            return false;
        *nodes = nn;
        *cap = grown;
    }
    node->id = *n;
    node->out.st->producer = node;
    (*nodes)[(*n)++] = node;
    return true;
}

/* ---- planning ---------------------------------------------------------------------------- */

/* An op a fused program can run (ops.def's fuse column), computing f32; a copy only from
 * a float dtype. */
static bool pointwise(const df_gnode *x)
{
    if (!df_vocab_op_fuses(x->op) || x->out.dtype != DF_DTYPE_F32)
        return false;
    return x->op != DF_OP_COPY || x->in[0].dtype == DF_DTYPE_F32 ||
           x->in[0].dtype == DF_DTYPE_BF16 || x->in[0].dtype == DF_DTYPE_F16;
}

/* Whether input view v of a node is exactly the dense output of node p. */
static bool identity_view(const df_gview *v, const df_gnode *p)
{
    if (v->st != p->out.st || v->offset != 0 || v->ndim != p->out.ndim || v->dtype != p->out.dtype)
        return false;
    for (int d = 0; d < v->ndim; d++)
        if (v->shape[d] != p->out.shape[d] || (v->shape[d] != 1 && v->stride[d] != p->out.stride[d]))
            return false;
    return true;
}

/* What the passes know of a node besides the plan itself; dropped once the plan is made. */
typedef struct pass_node {
    int uses;     /* how many reads of its output the needed nodes make */
    int parent;   /* fusion: the pointwise node whose group absorbs it, or -1 */
    bool is_head; /* fusion: the normalisation head of its group */
    int order;    /* memory: its kernel's position */
    int first;    /* memory: the first kernel that writes into it (an elided node's parts) */
    int last;     /* memory: the last kernel that reads it */
} pass_node;

/* The graph being planned, the plan being made and the passes' notes; each pass below
 * reads what the earlier ones wrote. */
typedef struct planner {
    df_gnode *const *nodes;
    int n;
    const df_device *dev;
    bool can_fuse; /* the device runs fused programs (DF_CAP_FUSED) */
    lz_program *p;
    pass_node *t;  /* per node */
    bool overflow; /* gen: the group being built does not fit one kernel */
} planner;

/* Emits the instructions computing node x inside group g; returns its register. */
static int gen(planner *pl, lz_group *g, int x)
{
    const df_gnode *nd = pl->nodes[x];
    int regs[2] = {0, 0};
    for (int k = 0; k < nd->n_in && k < 2; k++) {
        const df_gview *v = &nd->in[k];
        int prod = producer_of(v);
        bool inside = prod >= 0 && pl->p->node[prod].root_of == g->root;
        if (pl->overflow || g->n_insn >= DF_FUSED_MAX_INSN || g->n_regs >= 63) {
            pl->overflow = true;
            return 0;
        }
        if (inside && !pl->t[prod].is_head) {
            regs[k] = gen(pl, g, prod);
        } else if (inside) {
            g->insn[g->n_insn] = (df_fused_insn){.op = DF_FI_HEAD, .dst = (uint8_t)g->n_regs};
            g->insn_node[g->n_insn++] = prod;
            regs[k] = g->n_regs++;
        } else {
            if (g->n_in >= DF_FUSED_MAX_IN) {
                pl->overflow = true;
                return 0;
            }
            g->in[g->n_in].node = x;
            g->in[g->n_in].slot = k;
            g->insn[g->n_insn] = (df_fused_insn){.op = DF_FI_LOAD, .dst = (uint8_t)g->n_regs,
                                                 .a = (uint8_t)g->n_in++};
            g->insn_node[g->n_insn++] = -1;
            regs[k] = g->n_regs++;
        }
    }
    if (nd->op == DF_OP_COPY)
        return regs[0];
    if (g->n_insn >= DF_FUSED_MAX_INSN || g->n_regs >= 63) {
        pl->overflow = true;
        return 0;
    }
    g->insn[g->n_insn] = (df_fused_insn){.op = (uint8_t)nd->op,
                                         .dst = (uint8_t)g->n_regs, .a = (uint8_t)regs[0],
                                         .b = (uint8_t)regs[1]};
    g->insn_node[g->n_insn++] = x;
    return g->n_regs++;
}

static bool is_norm(const df_gnode *x)
{
    return x->op == DF_OP_LAYER_NORM || x->op == DF_OP_RMS_NORM;
}

/* Whether input view v is all of node p's output, in its own dense layout (any shape). */
static bool whole_view(const df_gview *v, const df_gnode *p)
{
    return v->st == p->out.st && v->offset == 0 && v->dtype == p->out.dtype &&
           df_gview_is_dense(v) && df_gview_numel(v) == df_gview_numel(&p->out);
}

/* Whether v is p's [B, S, H, D] output seen as [B, H, S, D] (the heads moved forward). */
static bool heads_first_view(const df_gview *v, const df_gnode *p)
{
    const df_gview *o = &p->out;
    if (v->st != o->st || v->offset != 0 || v->dtype != o->dtype || v->ndim != 4 || o->ndim != 4)
        return false;
    int64_t B = o->shape[0], S = o->shape[1], H = o->shape[2], D = o->shape[3];
    const int64_t shape[4] = {B, H, S, D}, stride[4] = {S * H * D, D, H * D, 1};
    for (int d = 0; d < 4; d++)
        if (v->shape[d] != shape[d] || (shape[d] != 1 && v->stride[d] != stride[d]))
            return false;
    return true;
}

/* A node whose output only one other node reads and no handle sees. */
static bool sole_use(const planner *pl, int i)
{
    return i >= 0 && pl->p->node[i].kind == K_SINGLE && pl->t[i].uses == 1 &&
           pl->nodes[i]->out.st->handles == 0;
}

/* The node that reads node i's output (the first one; the only one when it has one use). */
static int reader_of(df_gnode *const *nodes, int n, int i)
{
    for (int j = i + 1; j < n; j++)
        for (int k = 0; k < nodes[j]->n_in; k++)
            if (producer_of(&nodes[j]->in[k]) == i)
                return j;
    return -1;
}

/* Whether v, seen in the shape of `out`, is one row of out's last dimension broadcast over
 * all the others (an AdaLN gate [B=1, 1, D] against [1, S, D]). */
static bool broadcast_row(const df_gview *v, const df_gview *out)
{
    int last = out->ndim - 1;
    if (v->dtype != DF_DTYPE_F32 || v->ndim != out->ndim || last < 0 || v->stride[last] != 1)
        return false;
    for (int d = 0; d < out->ndim; d++)
        if (v->shape[d] != out->shape[d] || (d < last && v->shape[d] != 1 && v->stride[d] != 0))
            return false;
    return true;
}

/* Whether v has out's shape as f32 rows of the last dimension, evenly spaced. */
static bool even_rows(const df_gview *v, const df_gview *out)
{
    int last = out->ndim - 1;
    if (v->dtype != DF_DTYPE_F32 || v->ndim != out->ndim || last < 1 || v->stride[last] != 1)
        return false;
    for (int d = 0; d < out->ndim; d++)
        if (v->shape[d] != out->shape[d] ||
            (d < last - 1 && v->shape[d] != 1 && v->stride[d] != v->stride[d + 1] * v->shape[d + 1]))
            return false;
    return v->stride[last - 1] >= v->shape[last];
}

static bool same_shape(const df_gview *a, const df_gview *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    return true;
}

/* Whether the device's products apply activation `act` on their way out. */
static bool has_epilogue(const df_device *dev, int act)
{
    uint32_t cap = df_vocab_act_cap(act);
    return cap && df_dev_has(dev, cap);
}

/* The gated residual of FLUX and SD3 blocks, x + gate * linear(h): the product multiplies
 * by the gate row and adds the residual on its way out (post-ops of the GEMM provider), so
 * neither the product's result nor the gated one is ever written on its own. */
static void plan_gated_residuals(planner *pl)
{
    df_gnode *const *nodes = pl->nodes;
    int n = pl->n;
    lz_program *p = pl->p;
    for (int l = 0; l < n; l++) {
        const df_gnode *lin = nodes[l];
        if (p->node[l].kind != K_SINGLE || lin->op != DF_OP_LINEAR || lin->a.gated ||
            pl->t[l].uses != 1 || p->node[l].fold >= 0 || lin->out.st->handles > 0 ||
            lin->out.dtype != DF_DTYPE_F32)
            continue;
        int m = reader_of(nodes, n, l);
        if (m < 0 || nodes[m]->op != DF_OP_MUL || p->node[m].kind != K_SINGLE || pl->t[m].uses != 1 ||
            nodes[m]->out.st->handles > 0 || !same_shape(&nodes[m]->out, &lin->out))
            continue;
        int ms = identity_view(&nodes[m]->in[0], lin) ? 0 : 1; /* the product's slot */
        if (!identity_view(&nodes[m]->in[ms], lin) ||
            !broadcast_row(&nodes[m]->in[1 - ms], &lin->out))
            continue;
        int a = reader_of(nodes, n, m);
        if (a < 0 || nodes[a]->op != DF_OP_ADD || p->node[a].kind != K_SINGLE ||
            !same_shape(&nodes[a]->out, &lin->out))
            continue;
        int as = identity_view(&nodes[a]->in[0], nodes[m]) ? 0 : 1; /* the gated slot */
        const df_gview *res = &nodes[a]->in[1 - as];
        int rp = producer_of(res);
        if (!identity_view(&nodes[a]->in[as], nodes[m]) || !even_rows(res, &lin->out) ||
            rp == l || rp == m)
            continue;
        p->node[l].fold = a;
        p->node[l].gate_mul = m;
        p->node[l].epi_slots = (uint8_t)((1 - ms) | (1 - as) << 1);
        p->node[m].kind = p->node[a].kind = K_FOLDED;
    }
}

/* RMS norm and RoPE in one pass: rope(permute(rms_norm(x))), or the same over the concat
 * of several rms_norm parts along the sequence (the two streams of a FLUX double block),
 * becomes one rms_norm_rope kernel per part, each writing its rows of the rope's output.
 * The concat is then never materialised. */
static void plan_norm_rope(planner *pl)
{
    df_gnode *const *nodes = pl->nodes;
    int n = pl->n;
    lz_program *p = pl->p;
    for (int r = 0; r < n; r++) {
        const df_gnode *rope = nodes[r];
        if (p->node[r].kind != K_SINGLE || rope->op != DF_OP_ROPE || rope->in[0].dtype != DF_DTYPE_F32 ||
            rope->in[1].dtype != DF_DTYPE_F32 || !df_gview_is_dense(&rope->in[1]))
            continue;
        int src = producer_of(&rope->in[0]);
        if (!sole_use(pl, src) || !heads_first_view(&rope->in[0], nodes[src]))
            continue;
        int part[2], n_part = 0;
        const df_gnode *c = nodes[src];
        if (c->op == DF_OP_RMS_NORM) {
            part[n_part++] = src;
        } else if (c->op == DF_OP_CONCAT && c->a.axis == 1) {
            for (int k = 0; k < 2; k++) {
                int q = producer_of(&c->in[k]);
                if (!sole_use(pl, q) || nodes[q]->op != DF_OP_RMS_NORM ||
                    !whole_view(&c->in[k], nodes[q]) || (k == 1 && q == part[0]))
                    break;
                part[n_part++] = q;
            }
            if (n_part != 2)
                continue;
        } else {
            continue;
        }
        bool ok = true;
        for (int k = 0; k < n_part; k++) {
            const df_gnode *q = nodes[part[k]];
            ok = ok && q->out.ndim == 4 && q->in[0].dtype == DF_DTYPE_F32 &&
                 df_gview_is_dense(&q->in[0]);
        }
        if (!ok)
            continue;
        int64_t s0 = 0;
        for (int k = 0; k < n_part; k++) {
            p->node[part[k]].rope_of = r;
            p->node[part[k]].rope_s0 = s0;
            s0 += nodes[part[k]]->out.shape[1];
        }
        p->node[r].kind = K_ELIDED;
        if (c->op == DF_OP_CONCAT)
            p->node[src].kind = K_DEAD;
    }
}

/* The first of v's trailing dimensions whose product is `width`, or -1. */
static int trailing_split(const df_gview *v, int64_t width)
{
    int64_t prod = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        prod *= v->shape[d];
        if (prod == width)
            return d;
        if (prod > width)
            break;
    }
    return -1;
}

/* A concat whose inputs are whole outputs of nodes nothing else reads: those nodes write
 * their results straight into the concat's memory, and the copy disappears. Two cases:
 * - the parts are contiguous in the output (nothing but ones before the concat
 *   dimension): any kernel writes its dense result at the part's offset;
 * - the concat joins rows along the last dimension (the attention output and the MLP
 *   branch of a FLUX single block): the part is every row's slice of columns, which the
 *   matrix products and attention can write with a row stride. */
static void plan_concat_in_place(planner *pl)
{
    df_gnode *const *nodes = pl->nodes;
    int n = pl->n;
    lz_program *p = pl->p;
    bool columns = df_dev_has(pl->dev, DF_CAP_OUT_STRIDED);
    for (int c = 0; c < n; c++) {
        const df_gnode *x = nodes[c];
        if (p->node[c].kind != K_SINGLE || x->op != DF_OP_CONCAT)
            continue;
        int dim = (int)x->a.axis, last = x->out.ndim - 1;
        int64_t outer = 1;
        for (int d = 0; d < dim; d++)
            outer *= x->out.shape[d];
        bool contiguous = outer == 1;
        if (!contiguous && (dim != last || !columns))
            continue;
        int writer[2], split[2] = {0, 0};
        int64_t off[2], at = 0;
        int k = 0;
        for (; k < 2; k++) {
            int q = producer_of(&x->in[k]), w = q;
            if (q >= 0 && p->node[q].kind == K_FOLDED) /* the product that computes it writes it */
                for (w = q - 1; w >= 0 && p->node[w].fold != q; w--)
                    ;
            if (q < 0 || w < 0 || pl->t[q].uses != 1 || nodes[q]->out.st->handles > 0 ||
                (p->node[w].kind != K_SINGLE && p->node[w].kind != K_ROOT) || p->node[w].rope_of >= 0 ||
                p->node[w].alias_of >= 0 || !whole_view(&x->in[k], nodes[q]) ||
                (k == 1 && w == writer[0]))
                break;
            if (!contiguous) {
                int op = nodes[w]->op;
                split[k] = trailing_split(&nodes[q]->out, x->in[k].shape[last]);
                if ((op != DF_OP_LINEAR && op != DF_OP_ATTENTION) || split[k] < 1 ||
                    x->in[k].dtype != DF_DTYPE_F32)
                    break;
            }
            writer[k] = w;
            off[k] = at;
            at += contiguous ? df_gview_numel(&x->in[k]) * (int64_t)df_dtype_size(x->in[k].dtype)
                             : x->in[k].shape[last];
        }
        if (k != 2)
            continue;
        for (k = 0; k < 2; k++) {
            p->node[writer[k]].alias_of = c;
            p->node[writer[k]].alias_off = off[k];
            p->node[writer[k]].alias_split = split[k];
        }
        p->node[c].kind = K_ELIDED;
    }
}

/* Whether slot k of node x is an operand that x converts to bf16 before using it: the
 * activations of a product, q, k and v of attention, when they compute in bf16. */
static bool rounds_to_bf16(const df_gnode *x, int k, const df_device *dev)
{
    bool operand = (x->op == DF_OP_LINEAR && k == 0) || (x->op == DF_OP_ATTENTION && k <= 2);
    return operand && df_dev_matmul_dtype(dev, (df_dtype)x->a.compute) == DF_DTYPE_BF16;
}

/* Whether node i's kernel can write a bf16 result: fused kernels, products, attention. */
static bool writes_bf16(df_gnode *const *nodes, const lz_program *p, int i)
{
    df_op op = nodes[i]->op;
    return p->node[i].kind == K_ROOT || (p->node[i].kind == K_SINGLE && op == DF_OP_ATTENTION) ||
           (p->node[i].kind == K_SINGLE && op == DF_OP_LINEAR && p->node[i].gate_mul < 0 &&
            !nodes[i]->a.gated);
}

/* A result that only bf16 products read, as operands they would round to bf16 anyway, is
 * written in bf16 by the kernel that makes it, rounded the way the products round: half
 * the bytes go to memory and the products read their operand as it is. Fused kernels,
 * rms_norm_rope and attention give the bits strict eager gives; a product writing a bf16
 * destination through oneDNN differs by one bf16 ulp in a few elements per million for
 * some shapes (the provider orders the sums of a packed product with a bf16 destination
 * differently). Results made in place count through their writers: a rope
 * output (the rms_norm_rope kernels) and a concat written by its parts' kernels. In FLUX:
 * the modulation output feeding three or four products, q and k and v feeding attention,
 * the attention output and the MLP activation feeding the output products. */
static void plan_half_outputs(planner *pl)
{
    df_gnode *const *nodes = pl->nodes;
    int n = pl->n;
    lz_program *p = pl->p;
    const df_device *dev = pl->dev;
    if (!df_dev_has(dev, DF_CAP_OUT_BF16) ||
        df_dev_matmul_dtype(dev, DF_DTYPE_BF16) != DF_DTYPE_BF16)
        return;
    for (int i = 0; i < n; i++) {
        bool can = writes_bf16(nodes, p, i) ||
                   (p->node[i].kind == K_ELIDED && nodes[i]->op == DF_OP_ROPE);
        if (p->node[i].kind == K_ELIDED && nodes[i]->op == DF_OP_CONCAT) {
            can = true;
            for (int w = 0; w < i; w++)
                if (p->node[w].alias_of == i)
                    can = can && writes_bf16(nodes, p, w);
        }
        int r = result_node(p, i);
        if (can && pl->t[r].uses > 0 && p->node[i].alias_of < 0 && nodes[r]->out.dtype == DF_DTYPE_F32 &&
            nodes[r]->out.st->handles == 0)
            p->node[r].half = true;
    }
    for (int j = 0; j < n; j++) {
        const df_gnode *x = nodes[j];
        if (p->node[j].kind == K_DEAD || p->node[j].kind == K_ELIDED)
            continue; /* an elided node reads nothing: others write its result */
        for (int k = 0; k < x->n_in; k++) {
            int q = producer_of(&x->in[k]);
            if (q >= 0 && !(p->node[j].kind == K_SINGLE && rounds_to_bf16(x, k, dev)))
                p->node[q].half = false;
        }
    }
}

/* ---- the passes ----------------------------------------------------------------------- */

/* 1. Liveness, backwards: a node is needed if a handle still sees its output or a needed
 * node reads it; the rest is K_DEAD and never allocated. Every field starts at "none". */
static void pass_liveness(planner *pl)
{
    for (int i = pl->n - 1; i >= 0; i--) {
        const df_gnode *x = pl->nodes[i];
        lz_node *q = &pl->p->node[i];
        *q = (lz_node){.group = -1, .root_of = -1, .fold = -1, .gate_mul = -1, .alias_of = -1,
                       .rope_of = -1, .offset = -1};
        pl->t[i].parent = -1;
        pl->t[i].first = pl->n;
        q->kind = x->out.st->handles > 0 || pl->t[i].uses > 0 ? K_SINGLE : K_DEAD;
        if (q->kind == K_DEAD)
            continue;
        for (int k = 0; k < x->n_in; k++) {
            int prod = producer_of(&x->in[k]);
            if (prod >= 0)
                pl->t[prod].uses++;
        }
    }
}

/* 2a. Epilogues: an activation that is the only reader of a linear's output is computed by
 * the product itself (a post-op of the GEMM provider). Not for bf16 products: the
 * provider's activation differs from the activation kernel by an f32 ulp now and then, and
 * a product that reads the result rounds it to bf16, where one ulp can move a value to the
 * next bf16 (FLUX.2 [klein]'s Qwen3 encoder in bf16 left strict eager at its 4th layer that
 * way). The activation then joins the pointwise group that reads it (SwiGLU's mul), which
 * writes what the next product reads, as strict eager does. */
static void pass_activation_epilogues(planner *pl)
{
    df_gnode *const *nodes = pl->nodes;
    lz_node *node = pl->p->node;
    for (int i = 0; i < pl->n; i++) {
        const df_gnode *l = nodes[i];
        if (node[i].kind != K_SINGLE || l->op != DF_OP_LINEAR || l->a.gated || pl->t[i].uses != 1 ||
            l->out.st->handles > 0 || rounds_to_bf16(l, 0, pl->dev))
            continue;
        int j = reader_of(nodes, pl->n, i);
        if (j < 0)
            continue;
        int act = activation_of(nodes[j]->op);
        if (node[j].kind == K_SINGLE && act != DF_ACT_NONE && has_epilogue(pl->dev, act) &&
            identity_view(&nodes[j]->in[0], l)) {
            node[j].kind = K_FOLDED;
            node[i].fold = j;
        }
    }
}

/* 2c. Fusion, first the groups: each pointwise node absorbs the groups of the producers
 * that only it reads (24 nodes at most), and a layer/RMS norm feeding it as its head when
 * the device runs heads. Sets pass_node.parent and .is_head. */
static void find_groups(planner *pl, bool heads)
{
    df_gnode *const *nodes = pl->nodes;
    const lz_node *node = pl->p->node;
    pass_node *t = pl->t;
    int *size = df_calloc((size_t)pl->n + 1, sizeof *size);
    bool *has_head = df_calloc((size_t)pl->n + 1, sizeof *has_head);
    if (!size || !has_head) {
        df_free(size);
        df_free(has_head);
        return; /* no fusion: every parent stays -1 */
    }
    for (int i = 0; i < pl->n; i++) {
        const df_gnode *x = nodes[i];
        if (node[i].kind != K_SINGLE || !pointwise(x))
            continue;
        size[i] = 1;
        for (int k = 0; k < x->n_in && k < 2; k++) {
            int prod = producer_of(&x->in[k]);
            if (prod < 0 || t[prod].uses != 1 || t[prod].parent >= 0 ||
                node[prod].kind != K_SINGLE || nodes[prod]->out.st->handles > 0 ||
                !identity_view(&x->in[k], nodes[prod]))
                continue;
            if (pointwise(nodes[prod]) && size[i] + size[prod] <= 24 &&
                !(has_head[i] && has_head[prod])) {
                t[prod].parent = i;
                size[i] += size[prod];
                has_head[i] = has_head[i] || has_head[prod];
            } else if (heads && is_norm(nodes[prod]) && !has_head[i]) {
                t[prod].parent = i;
                t[prod].is_head = true;
                has_head[i] = true;
            }
        }
    }
    df_free(size);
    df_free(has_head);
}

/* 2c. Fusion, then the kernels: each group's root gets its program (gen); a group too big
 * for one kernel falls apart and its nodes run one by one. */
static void pass_fuse(planner *pl)
{
    lz_program *p = pl->p;
    lz_node *node = p->node;
    find_groups(pl, df_dev_has(pl->dev, DF_CAP_FUSED_HEAD));
    for (int i = pl->n - 1; i >= 0; i--) { /* parents come later, so their roots are known */
        int up = pl->t[i].parent;
        node[i].root_of = up < 0 ? -1 : node[up].root_of >= 0 ? node[up].root_of : up;
    }
    for (int i = 0; i < pl->n; i++) {
        bool any = false;
        for (int j = 0; j < i && !any && node[i].kind != K_DEAD && node[i].root_of < 0; j++)
            any = node[j].root_of == i;
        if (!any)
            continue;
        lz_group *g = &p->groups[p->n_groups];
        *g = (lz_group){.root = i, .head = -1};
        for (int j = 0; j < i; j++)
            if (node[j].root_of == i && pl->t[j].is_head)
                g->head = j;
        pl->overflow = false;
        g->out_reg = gen(pl, g, i);
        if (pl->overflow) {
            for (int j = 0; j < i; j++)
                if (node[j].root_of == i)
                    node[j].root_of = -1;
            continue;
        }
        node[i].kind = K_ROOT;
        node[i].group = p->n_groups++;
        g->n_members = 1;
        for (int j = 0; j < i; j++)
            if (node[j].root_of == i) {
                node[j].kind = K_MEMBER;
                g->n_members++;
            }
    }
}

/* 3. Memory, the lifetimes: each kernel's position, and for each node the positions of the
 * first kernel writing into it (an elided node is live from its first part's kernel) and
 * of the last one reading it. */
static void pass_lifetimes(planner *pl)
{
    const lz_node *node = pl->p->node;
    pass_node *t = pl->t;
    int pos = 0;
    for (int i = 0; i < pl->n; i++)
        if (node[i].kind == K_SINGLE || node[i].kind == K_ROOT || node[i].kind == K_ELIDED)
            t[i].order = pos++;
    for (int i = 0; i < pl->n; i++) {
        if (node[i].kind == K_MEMBER)
            t[i].order = t[node[i].root_of].order;
        if (node[i].fold >= 0)
            t[node[i].fold].order = t[i].order;
        if (node[i].gate_mul >= 0)
            t[node[i].gate_mul].order = t[i].order;
        t[i].last = -1;
    }
    for (int i = 0; i < pl->n; i++) {
        int into = node[i].alias_of >= 0 ? node[i].alias_of : node[i].rope_of;
        if (into >= 0 && t[i].order < t[into].first)
            t[into].first = t[i].order;
    }
    for (int i = 0; i < pl->n; i++) {
        if (node[i].kind == K_DEAD)
            continue;
        for (int k = 0; k < pl->nodes[i]->n_in; k++) {
            int prod = producer_of(&pl->nodes[i]->in[k]);
            if (prod >= 0 && t[i].order > t[prod].last)
                t[prod].last = t[i].order;
        }
    }
    for (int i = 0; i < pl->n; i++) /* a folded pair's memory is the activation's output */
        if (node[i].fold >= 0 && t[node[i].fold].last > t[i].last)
            t[i].last = t[node[i].fold].last;
}

/* 3. Memory, the arena: every intermediate that is its own kernel's result (not seen by a
 * handle, not written into another node) gets the first offset where no buffer of an
 * overlapping lifetime lies. Without memory for that, every intermediate gets its own
 * buffer (offset -1). */
static void pass_arena(planner *pl)
{
    lz_program *p = pl->p;
    lz_node *node = p->node;
    typedef struct { int64_t off, bytes; int begin, end; } placed;
    placed *pls = df_malloc(((size_t)pl->n + 1) * sizeof *pls);
    if (!pls)
        return;
    int np = 0;
    for (int i = 0; i < pl->n; i++) {
        const df_storage *out = pl->nodes[result_node(p, i)]->out.st;
        if ((node[i].kind != K_SINGLE && node[i].kind != K_ROOT && node[i].kind != K_ELIDED) ||
            out->handles > 0 || node[i].alias_of >= 0 || node[i].rope_of >= 0)
            continue;
        int64_t bytes = node[result_node(p, i)].half ? (int64_t)out->bytes / 2 : (int64_t)out->bytes;
        bytes = (bytes + 63) / 64 * 64;
        const pass_node *t = &pl->t[i];
        int begin = t->first < t->order ? t->first : t->order;
        int end = t->last < t->order ? t->order : t->last;
        int64_t off = 0;
        for (bool moved = true; moved;) {
            moved = false;
            for (int k = 0; k < np; k++)
                if (begin <= pls[k].end && pls[k].begin <= end && off < pls[k].off + pls[k].bytes &&
                    pls[k].off < off + bytes) {
                    off = pls[k].off + pls[k].bytes;
                    moved = true;
                }
        }
        pls[np++] = (placed){off, bytes, begin, end};
        node[i].offset = off;
        if (off + bytes > p->arena_bytes)
            p->arena_bytes = off + bytes;
    }
    df_free(pls);
}

lz_program *df_graph_plan_make(df_gnode *const *nodes, int n, const df_device *dev)
{
    size_t n1 = (size_t)n + 1;
    lz_program *p = df_calloc(1, sizeof *p);
    planner pl = {.nodes = nodes, .n = n, .dev = dev, .can_fuse = df_dev_has(dev, DF_CAP_FUSED),
                  .p = p, .t = df_calloc(n1, sizeof *pl.t)};
    if (p) {
        p->n = n;
        p->node = df_calloc(n1, sizeof *p->node);
        p->groups = df_calloc(n1, sizeof *p->groups);
    }
    if (!p || !pl.t || !p->node || !p->groups) {
        df_graph_plan_free(p);
        df_free(pl.t);
        return NULL;
    }
    pass_liveness(&pl);
    if (pl.can_fuse) {
        pass_activation_epilogues(&pl);
        if (df_dev_has(dev, DF_CAP_EPI_GATED_RESIDUAL))
            plan_gated_residuals(&pl); /* 2a': x + gate * linear(h) */
        if (df_dev_has(dev, DF_CAP_OUT_STRIDED) && df_dev_has_op(dev, DF_OP_RMS_NORM_ROPE))
            plan_norm_rope(&pl); /* 2b */
        pass_fuse(&pl);
    }
    plan_concat_in_place(&pl); /* 2d */
    if (pl.can_fuse)
        plan_half_outputs(&pl);
    pass_lifetimes(&pl);
    pass_arena(&pl);
    df_free(pl.t);
    return p;
}

void df_graph_plan_free(lz_program *p)
{
    if (!p)
        return;
    df_free(p->node);
    df_free(p->groups);
    df_free(p);
}

int64_t df_graph_plan_arena(const lz_program *p)
{
    return p->arena_bytes;
}

int df_graph_plan_kernels(const lz_program *p)
{
    int k = 0;
    for (int i = 0; i < p->n; i++)
        k += p->node[i].kind == K_SINGLE || p->node[i].kind == K_ROOT;
    return k;
}

lz_program *df_graph_plan_cached(lz_program **cache, df_gnode *const *nodes, int n,
                                 const df_device *dev, bool *hit)
{
    uint64_t key = df_graph_key(nodes, n);
    lz_program *p = *cache;
    while (p && (p->key != key || p->n != n))
        p = p->next;
    *hit = p != NULL;
    if (!p && (p = df_graph_plan_make(nodes, n, dev))) {
        p->key = key;
        p->next = *cache;
        *cache = p;
    }
    return p;
}

void df_graph_cache_free(lz_program *cache)
{
    for (lz_program *p = cache, *next; p; p = next) {
        next = p->next;
        df_graph_plan_free(p);
    }
}
