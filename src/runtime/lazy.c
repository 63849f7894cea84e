/*
 * Defer-and-fuse mode: ops are recorded into a pending graph and run at sync points.
 *
 * A graph is cut at a host read, df_sync(), df_mark_step() or when it reaches
 * ctx->fuse_max_nodes nodes. Then:
 *   1. liveness: a node is needed if a tensor handle still sees its output or a needed node
 *      reads it; the rest is dropped without ever being allocated;
 *   2. fusion: chains of pointwise ops (add, sub, mul, div, scale, activations, f32 copies)
 *      whose intermediate results nobody else reads become one kernel, and a layer/RMS norm
 *      feeding such a chain becomes its "head" (normalisation + AdaLN modulation in one
 *      pass); a matrix product's epilogue chain is thereby one pass right after it; an
 *      activation right after a matrix product is applied by the product itself; RMS
 *      norm -> [concat ->] permute -> RoPE (q and k before attention) is one pass per part
 *      that writes the rotated rows where attention reads them; and a concat whose parts
 *      are contiguous has its inputs' producers write into it, so it copies nothing;
 *   3. memory: outputs still seen by handles get their own buffers; every other
 *      intermediate gets an offset in one arena, planned from the kernels' order so that
 *      buffers whose lifetimes do not overlap share memory.
 * The plan is cached under a hash of the graph's structure: ops, integer attributes,
 * shapes, dtypes, view layouts, which node feeds which input, which outputs are visible.
 * Data pointers and float attributes (timestep-dependent scales, eps) are not part of it:
 * they are read from the nodes at every run, so the same denoising step, or the same block
 * at another depth, reuses the plan. Planning is a few linear passes over the graph, so it
 * runs inline: the first step pays microseconds, not a compile.
 */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "runtime/lazy.h"

typedef struct lz_group {
    int root, head, n_members;
    int n_in;
    struct { int node, slot; } in[DF_FUSED_MAX_IN];
    int n_insn;
    df_fused_insn insn[DF_FUSED_MAX_INSN];
    int insn_node[DF_FUSED_MAX_INSN]; /* node whose float attributes an insn takes */
    int n_regs, out_reg;
} lz_group;

/* K_FOLDED: an activation computed by the matrix product that feeds it (epilogue).
 * K_ELIDED: a node whose output others write in place (a concat whose parts are written
 * straight into it, a rope whose input is normalised and rotated in one pass): it has
 * memory but no kernel. */
enum { K_DEAD, K_SINGLE, K_MEMBER, K_ROOT, K_FOLDED, K_ELIDED };

struct lz_program {
    struct lz_program *next;
    uint64_t key;
    int n;
    uint8_t *kind;      /* per node */
    int *group;         /* per node: index into groups for K_ROOT, -1 otherwise */
    int *root_of;       /* per node: the root of the fused group it is part of, or -1 */
    int *fold;          /* per LINEAR node: the activation node folded into it, or the add of
                           its gated residual epilogue; -1 when none */
    int *gate_mul;      /* per LINEAR node: the mul of its gated residual epilogue, or -1 */
    uint8_t *epi_slots; /* ... the mul's gate slot (bit 0) and the add's residual slot (bit 1) */
    int *alias_of;      /* per node: the elided concat its output is a part of, or -1 */
    int64_t *alias_off; /* ... the part's byte offset in it (contiguous parts), or its
                           first column (parts of the concat's rows) */
    int *alias_split;   /* ... 0 for a contiguous part; else the first of the node's own
                           trailing dimensions that make up the part's columns */
    int *rope_of;       /* per RMS_NORM node: the elided rope it writes (rms_norm_rope), or -1 */
    bool *half;         /* per fused root: writes bf16, for the bf16 products that read it */
    int64_t *rope_s0;   /* ... and the first position of its part */
    int64_t *offset;    /* per node: arena offset, -1 = own buffer or not materialised */
    int64_t arena_bytes;
    lz_group *groups;
    int n_groups;
};

typedef struct lz_state {
    df_node **nodes;
    int n, cap;
    lz_program *cache;
} lz_state;

/* ---- structure hash -------------------------------------------------------------------- */

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0x100000001b3ull;
}

static int producer_of(const df_view *v)
{
    return v->st && v->st->producer && !v->st->data ? v->st->producer->id : -1;
}

static uint64_t hash_view(uint64_t h, const df_view *v)
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

static uint64_t graph_key(df_node *const *nodes, int n)
{
    uint64_t h = mix(0xcbf29ce484222325ull, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        const df_node *x = nodes[i];
        h = mix(h, (uint64_t)x->op);
        for (int k = 0; k < 8; k++)
            h = mix(h, (uint64_t)x->a.i[k]);
        h = mix(h, (uint64_t)(x->out.st->handles > 0));
        h = hash_view(h, &x->out);
        for (int k = 0; k < x->n_in; k++)
            h = hash_view(h, &x->in[k]);
    }
    return h;
}


/* ---- planning ---------------------------------------------------------------------------- */

static bool pointwise(const df_node *x)
{
    switch (x->op) {
    case DF_OP_ADD: case DF_OP_SUB: case DF_OP_MUL: case DF_OP_DIV: case DF_OP_SCALE:
    case DF_OP_SILU: case DF_OP_GELU: case DF_OP_GELU_TANH: case DF_OP_QUICK_GELU:
        return x->out.dtype == DF_DTYPE_F32;
    case DF_OP_COPY:
        return x->out.dtype == DF_DTYPE_F32 &&
               (x->in[0].dtype == DF_DTYPE_F32 || x->in[0].dtype == DF_DTYPE_BF16 ||
                x->in[0].dtype == DF_DTYPE_F16);
    default:
        return false;
    }
}

/* Whether input view v of a node is exactly the dense output of node p. */
static bool identity_view(const df_view *v, const df_node *p)
{
    if (v->st != p->out.st || v->offset != 0 || v->ndim != p->out.ndim || v->dtype != p->out.dtype)
        return false;
    for (int d = 0; d < v->ndim; d++)
        if (v->shape[d] != p->out.shape[d] || (v->shape[d] != 1 && v->stride[d] != p->out.stride[d]))
            return false;
    return true;
}

static int activation_of(df_op op)
{
    switch (op) {
    case DF_OP_GELU_TANH: return DF_ACT_GELU_TANH;
    case DF_OP_SILU: return DF_ACT_SILU;
    case DF_OP_GELU: return DF_ACT_GELU;
    default: return DF_ACT_NONE;
    }
}

static df_fused_opcode opcode_of(df_op op)
{
    switch (op) {
    case DF_OP_ADD: return DF_FI_ADD;
    case DF_OP_SUB: return DF_FI_SUB;
    case DF_OP_MUL: return DF_FI_MUL;
    case DF_OP_DIV: return DF_FI_DIV;
    case DF_OP_SCALE: return DF_FI_SCALE;
    case DF_OP_SILU: return DF_FI_SILU;
    case DF_OP_GELU: return DF_FI_GELU;
    case DF_OP_GELU_TANH: return DF_FI_GELU_TANH;
    case DF_OP_QUICK_GELU: return DF_FI_QUICK_GELU;
    default: return DF_FI_COPY;
    }
}

typedef struct planner {
    df_node *const *nodes;
    int n;
    int *root_of;   /* node -> root of the fused group it belongs to, or -1 */
    bool *is_head;  /* node is the normalisation head of its group */
    bool overflow;
} planner;

/* Emits the instructions computing node x inside group g; returns its register. */
static int gen(planner *pl, lz_group *g, int x)
{
    const df_node *nd = pl->nodes[x];
    int regs[2] = {0, 0};
    for (int k = 0; k < nd->n_in && k < 2; k++) {
        const df_view *v = &nd->in[k];
        int prod = producer_of(v);
        bool inside = prod >= 0 && pl->root_of[prod] == g->root;
        if (pl->overflow || g->n_insn >= DF_FUSED_MAX_INSN || g->n_regs >= 63) {
            pl->overflow = true;
            return 0;
        }
        if (inside && !pl->is_head[prod]) {
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
    g->insn[g->n_insn] = (df_fused_insn){.op = (uint8_t)opcode_of(nd->op),
                                         .dst = (uint8_t)g->n_regs, .a = (uint8_t)regs[0],
                                         .b = (uint8_t)regs[1]};
    g->insn_node[g->n_insn++] = x;
    return g->n_regs++;
}

static bool is_norm(const df_node *x)
{
    return x->op == DF_OP_LAYER_NORM || x->op == DF_OP_RMS_NORM;
}

/* Whether input view v is all of node p's output, in its own dense layout (any shape). */
static bool whole_view(const df_view *v, const df_node *p)
{
    return v->st == p->out.st && v->offset == 0 && v->dtype == p->out.dtype &&
           df_view_is_dense(v) && df_view_numel(v) == df_view_numel(&p->out);
}

/* Whether v is p's [B, S, H, D] output seen as [B, H, S, D] (the heads moved forward). */
static bool heads_first_view(const df_view *v, const df_node *p)
{
    const df_view *o = &p->out;
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
static bool sole_use(df_node *const *nodes, const lz_program *p, const int *uses, int i)
{
    return i >= 0 && p->kind[i] == K_SINGLE && uses[i] == 1 && nodes[i]->out.st->handles == 0;
}

/* The node that reads node i's output (the first one; the only one when uses[i] is 1). */
static int reader_of(df_node *const *nodes, int n, int i)
{
    for (int j = i + 1; j < n; j++)
        for (int k = 0; k < nodes[j]->n_in; k++)
            if (producer_of(&nodes[j]->in[k]) == i)
                return j;
    return -1;
}

/* Whether v, seen in the shape of `out`, is one row of out's last dimension broadcast over
 * all the others (an AdaLN gate [B=1, 1, D] against [1, S, D]). */
static bool broadcast_row(const df_view *v, const df_view *out)
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
static bool even_rows(const df_view *v, const df_view *out)
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

static bool same_shape(const df_view *a, const df_view *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    return true;
}

/* The gated residual of FLUX and SD3 blocks, x + gate * linear(h): the product multiplies
 * by the gate row and adds the residual on its way out (post-ops of the GEMM provider), so
 * neither the product's result nor the gated one is ever written on its own. */
static void plan_gated_residuals(df_node *const *nodes, int n, lz_program *p, const int *uses)
{
    for (int l = 0; l < n; l++) {
        const df_node *lin = nodes[l];
        if (p->kind[l] != K_SINGLE || lin->op != DF_OP_LINEAR || uses[l] != 1 ||
            p->fold[l] >= 0 || lin->out.st->handles > 0 || lin->out.dtype != DF_DTYPE_F32)
            continue;
        int m = reader_of(nodes, n, l);
        if (m < 0 || nodes[m]->op != DF_OP_MUL || p->kind[m] != K_SINGLE || uses[m] != 1 ||
            nodes[m]->out.st->handles > 0 || !same_shape(&nodes[m]->out, &lin->out))
            continue;
        int ms = identity_view(&nodes[m]->in[0], lin) ? 0 : 1; /* the product's slot */
        if (!identity_view(&nodes[m]->in[ms], lin) ||
            !broadcast_row(&nodes[m]->in[1 - ms], &lin->out))
            continue;
        int a = reader_of(nodes, n, m);
        if (a < 0 || nodes[a]->op != DF_OP_ADD || p->kind[a] != K_SINGLE ||
            !same_shape(&nodes[a]->out, &lin->out))
            continue;
        int as = identity_view(&nodes[a]->in[0], nodes[m]) ? 0 : 1; /* the gated slot */
        const df_view *res = &nodes[a]->in[1 - as];
        int rp = producer_of(res);
        if (!identity_view(&nodes[a]->in[as], nodes[m]) || !even_rows(res, &lin->out) ||
            rp == l || rp == m)
            continue;
        p->fold[l] = a;
        p->gate_mul[l] = m;
        p->epi_slots[l] = (uint8_t)((1 - ms) | (1 - as) << 1);
        p->kind[m] = p->kind[a] = K_FOLDED;
    }
}

/* RMS norm and RoPE in one pass: rope(permute(rms_norm(x))), or the same over the concat
 * of several rms_norm parts along the sequence (the two streams of a FLUX double block),
 * becomes one rms_norm_rope kernel per part, each writing its rows of the rope's output.
 * The concat is then never materialised. */
static void plan_norm_rope(df_node *const *nodes, int n, lz_program *p, const int *uses)
{
    for (int r = 0; r < n; r++) {
        const df_node *rope = nodes[r];
        if (p->kind[r] != K_SINGLE || rope->op != DF_OP_ROPE || rope->in[0].dtype != DF_DTYPE_F32 ||
            rope->in[1].dtype != DF_DTYPE_F32 || !df_view_is_dense(&rope->in[1]))
            continue;
        int src = producer_of(&rope->in[0]);
        if (!sole_use(nodes, p, uses, src) || !heads_first_view(&rope->in[0], nodes[src]))
            continue;
        int part[2], n_part = 0;
        const df_node *c = nodes[src];
        if (c->op == DF_OP_RMS_NORM) {
            part[n_part++] = src;
        } else if (c->op == DF_OP_CONCAT && c->a.i[0] == 1) {
            for (int k = 0; k < 2; k++) {
                int q = producer_of(&c->in[k]);
                if (!sole_use(nodes, p, uses, q) || nodes[q]->op != DF_OP_RMS_NORM ||
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
            const df_node *q = nodes[part[k]];
            ok = ok && q->out.ndim == 4 && q->in[0].dtype == DF_DTYPE_F32 &&
                 df_view_is_dense(&q->in[0]);
        }
        if (!ok)
            continue;
        int64_t s0 = 0;
        for (int k = 0; k < n_part; k++) {
            p->rope_of[part[k]] = r;
            p->rope_s0[part[k]] = s0;
            s0 += nodes[part[k]]->out.shape[1];
        }
        p->kind[r] = K_ELIDED;
        if (c->op == DF_OP_CONCAT)
            p->kind[src] = K_DEAD;
    }
}

/* The first of v's trailing dimensions whose product is `width`, or -1. */
static int trailing_split(const df_view *v, int64_t width)
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
static void plan_concat_in_place(df_node *const *nodes, int n, lz_program *p, const int *uses)
{
    for (int c = 0; c < n; c++) {
        const df_node *x = nodes[c];
        if (p->kind[c] != K_SINGLE || x->op != DF_OP_CONCAT)
            continue;
        int dim = (int)x->a.i[0], last = x->out.ndim - 1;
        int64_t outer = 1;
        for (int d = 0; d < dim; d++)
            outer *= x->out.shape[d];
        bool contiguous = outer == 1;
        if (!contiguous && dim != last)
            continue;
        int writer[2], split[2] = {0, 0};
        int64_t off[2], at = 0;
        int k = 0;
        for (; k < 2; k++) {
            int q = producer_of(&x->in[k]), w = q;
            if (q >= 0 && p->kind[q] == K_FOLDED) /* the product that computes it writes it */
                for (w = q - 1; w >= 0 && p->fold[w] != q; w--)
                    ;
            if (q < 0 || w < 0 || uses[q] != 1 || nodes[q]->out.st->handles > 0 ||
                (p->kind[w] != K_SINGLE && p->kind[w] != K_ROOT) || p->rope_of[w] >= 0 ||
                p->alias_of[w] >= 0 || !whole_view(&x->in[k], nodes[q]) ||
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
            at += contiguous ? df_view_numel(&x->in[k]) * (int64_t)df_dtype_size(x->in[k].dtype)
                             : x->in[k].shape[last];
        }
        if (k != 2)
            continue;
        for (k = 0; k < 2; k++) {
            p->alias_of[writer[k]] = c;
            p->alias_off[writer[k]] = off[k];
            p->alias_split[writer[k]] = split[k];
        }
        p->kind[c] = K_ELIDED;
    }
}

/* Whether slot k of node x is an operand that x converts to bf16 before using it: the
 * activations of a product, q, k and v of attention, when they compute in bf16. */
static bool rounds_to_bf16(const df_node *x, int k, const df_backend_ops *ops)
{
    if (x->op == DF_OP_LINEAR && k == 0)
        return ops->matmul_dtype((df_dtype)x->a.i[0]) == DF_DTYPE_BF16;
    if (x->op == DF_OP_ATTENTION && k <= 2)
        return ops->matmul_dtype((df_dtype)x->a.i[1]) == DF_DTYPE_BF16;
    return false;
}

/* The node whose storage holds node i's result: the activation folded into a product. */
static int result_node(const lz_program *p, int i)
{
    return p->fold[i] >= 0 ? p->fold[i] : i;
}

/* Whether node i's kernel can write a bf16 result: fused kernels, products, attention. */
static bool writes_bf16(df_node *const *nodes, const lz_program *p, int i)
{
    df_op op = nodes[i]->op;
    return p->kind[i] == K_ROOT || (p->kind[i] == K_SINGLE && op == DF_OP_ATTENTION) ||
           (p->kind[i] == K_SINGLE && op == DF_OP_LINEAR && p->gate_mul[i] < 0);
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
static void plan_half_outputs(df_node *const *nodes, int n, lz_program *p, const int *uses,
                              const df_backend_ops *ops)
{
    if (!ops->matmul_dtype || ops->matmul_dtype(DF_DTYPE_BF16) != DF_DTYPE_BF16)
        return;
    for (int i = 0; i < n; i++) {
        bool can = writes_bf16(nodes, p, i) ||
                   (p->kind[i] == K_ELIDED && nodes[i]->op == DF_OP_ROPE);
        if (p->kind[i] == K_ELIDED && nodes[i]->op == DF_OP_CONCAT) {
            can = true;
            for (int w = 0; w < i; w++)
                if (p->alias_of[w] == i)
                    can = can && writes_bf16(nodes, p, w);
        }
        int r = result_node(p, i);
        if (can && uses[r] > 0 && p->alias_of[i] < 0 && nodes[r]->out.dtype == DF_DTYPE_F32 &&
            nodes[r]->out.st->handles == 0)
            p->half[r] = true;
    }
    for (int j = 0; j < n; j++) {
        const df_node *x = nodes[j];
        if (p->kind[j] == K_DEAD || p->kind[j] == K_ELIDED)
            continue; /* an elided node reads nothing: others write its result */
        for (int k = 0; k < x->n_in; k++) {
            int q = producer_of(&x->in[k]);
            if (q >= 0 && !(p->kind[j] == K_SINGLE && rounds_to_bf16(x, k, ops)))
                p->half[q] = false;
        }
    }
}

/* Fusion: each pointwise node absorbs the groups of producers that only it reads. */
static void find_groups(df_node *const *nodes, int n, const lz_program *p, const int *uses,
                        int *parent, bool *is_head)
{
    int *size = df_calloc((size_t)n + 1, sizeof *size);
    bool *has_head = df_calloc((size_t)n + 1, sizeof *has_head);
    if (!size || !has_head) {
        df_free(size);
        df_free(has_head);
        return; /* no fusion: every parent stays -1 */
    }
    for (int i = 0; i < n; i++) {
        const df_node *x = nodes[i];
        if (p->kind[i] != K_SINGLE || !pointwise(x))
            continue;
        size[i] = 1;
        for (int k = 0; k < x->n_in && k < 2; k++) {
            int prod = producer_of(&x->in[k]);
            if (prod < 0 || uses[prod] != 1 || parent[prod] >= 0 || p->kind[prod] != K_SINGLE ||
                nodes[prod]->out.st->handles > 0 || !identity_view(&x->in[k], nodes[prod]))
                continue;
            if (pointwise(nodes[prod]) && size[i] + size[prod] <= 24 &&
                !(has_head[i] && has_head[prod])) {
                parent[prod] = i;
                size[i] += size[prod];
                has_head[i] = has_head[i] || has_head[prod];
            } else if (is_norm(nodes[prod]) && !has_head[i]) {
                parent[prod] = i;
                is_head[prod] = true;
                has_head[i] = true;
            }
        }
    }
    df_free(size);
    df_free(has_head);
}

lz_program *df_graph_plan_make(df_node *const *nodes, int n, const df_backend_ops *ops)
{
    bool can_fuse = ops->run_fused != NULL;
    size_t n1 = (size_t)n + 1;
    lz_program *p = df_calloc(1, sizeof *p);
    int *uses = df_calloc(n1, sizeof *uses);
    int *order = df_calloc(n1, sizeof *order); /* kernel position per node */
    int *last = df_calloc(n1, sizeof *last);   /* last kernel position reading it */
    int *first = df_malloc(n1 * sizeof *first); /* first kernel position writing it */
    int *parent = df_malloc(n1 * sizeof *parent);
    bool *is_head = df_calloc(n1, sizeof *is_head);
    if (p) {
        p->n = n;
        p->kind = df_calloc(n1, 1);
        p->group = df_malloc(n1 * sizeof *p->group);
        p->root_of = df_malloc(n1 * sizeof *p->root_of);
        p->fold = df_malloc(n1 * sizeof *p->fold);
        p->gate_mul = df_malloc(n1 * sizeof *p->gate_mul);
        p->epi_slots = df_calloc(n1, sizeof *p->epi_slots);
        p->alias_of = df_malloc(n1 * sizeof *p->alias_of);
        p->alias_off = df_calloc(n1, sizeof *p->alias_off);
        p->alias_split = df_calloc(n1, sizeof *p->alias_split);
        p->rope_of = df_malloc(n1 * sizeof *p->rope_of);
        p->rope_s0 = df_calloc(n1, sizeof *p->rope_s0);
        p->half = df_calloc(n1, sizeof *p->half);
        p->offset = df_malloc(n1 * sizeof *p->offset);
        p->groups = df_calloc(n1, sizeof *p->groups);
    }
    if (!p || !uses || !order || !last || !first || !parent || !is_head || !p->kind ||
        !p->group || !p->root_of || !p->fold || !p->gate_mul || !p->epi_slots ||
        !p->alias_of || !p->alias_off ||
        !p->alias_split || !p->rope_of || !p->rope_s0 || !p->half || !p->offset ||
        !p->groups) {
        df_graph_plan_free(p);
        p = NULL;
        goto done;
    }
    /* 1. Liveness, backwards. */
    for (int i = n - 1; i >= 0; i--) {
        const df_node *x = nodes[i];
        p->group[i] = p->root_of[i] = parent[i] = p->fold[i] = -1;
        p->alias_of[i] = p->rope_of[i] = p->gate_mul[i] = -1;
        first[i] = n;
        p->offset[i] = -1;
        p->kind[i] = x->out.st->handles > 0 || uses[i] > 0 ? K_SINGLE : K_DEAD;
        if (p->kind[i] == K_DEAD)
            continue;
        for (int k = 0; k < x->n_in; k++) {
            int prod = producer_of(&x->in[k]);
            if (prod >= 0)
                uses[prod]++;
        }
    }
    /* 2a. Epilogues: an activation that is the only reader of a linear's output is computed
     * by the product itself (a post-op of the GEMM provider). */
    for (int i = 0; can_fuse && i < n; i++) {
        const df_node *l = nodes[i];
        if (p->kind[i] != K_SINGLE || l->op != DF_OP_LINEAR || uses[i] != 1 ||
            l->out.st->handles > 0)
            continue;
        for (int j = i + 1; j < n; j++) {
            const df_node *a = nodes[j];
            bool reads = false;
            for (int k = 0; k < a->n_in; k++)
                reads = reads || producer_of(&a->in[k]) == i;
            if (!reads)
                continue;
            if (p->kind[j] == K_SINGLE && activation_of(a->op) != DF_ACT_NONE &&
                identity_view(&a->in[0], l)) {
                p->kind[j] = K_FOLDED;
                p->fold[i] = j;
            }
            break;
        }
    }
    /* 2a'. Gated residuals as epilogues of the products that feed them. */
    if (can_fuse)
        plan_gated_residuals(nodes, n, p, uses);
    /* 2b. Normalisation and RoPE in one pass. */
    if (can_fuse && ops->kernels[DF_OP_RMS_NORM_ROPE])
        plan_norm_rope(nodes, n, p, uses);
    /* 2c. Fusion: groups, their roots, their code. */
    if (can_fuse)
        find_groups(nodes, n, p, uses, parent, is_head);
    for (int i = n - 1; i >= 0; i--) /* parents come later, so their roots are known */
        p->root_of[i] = parent[i] < 0 ? -1 : (p->root_of[parent[i]] >= 0 ? p->root_of[parent[i]] : parent[i]);
    planner pl = {.nodes = nodes, .n = n, .root_of = p->root_of, .is_head = is_head};
    for (int i = 0; i < n; i++) {
        bool any = false;
        for (int j = 0; j < i && !any && p->kind[i] != K_DEAD && p->root_of[i] < 0; j++)
            any = p->root_of[j] == i;
        if (!any)
            continue;
        lz_group *g = &p->groups[p->n_groups];
        *g = (lz_group){.root = i, .head = -1};
        for (int j = 0; j < i; j++)
            if (p->root_of[j] == i && is_head[j])
                g->head = j;
        pl.overflow = false;
        g->out_reg = gen(&pl, g, i);
        if (pl.overflow) { /* too big for one kernel: its nodes run one by one */
            for (int j = 0; j < i; j++)
                if (p->root_of[j] == i)
                    p->root_of[j] = -1;
            continue;
        }
        p->kind[i] = K_ROOT;
        p->group[i] = p->n_groups++;
        g->n_members = 1;
        for (int j = 0; j < i; j++)
            if (p->root_of[j] == i) {
                p->kind[j] = K_MEMBER;
                g->n_members++;
            }
    }
    /* 2d. Concats whose parts are written in place; bf16 results for bf16 products. */
    plan_concat_in_place(nodes, n, p, uses);
    if (can_fuse)
        plan_half_outputs(nodes, n, p, uses, ops);
    /* 3. Memory: kernel order, last use, then first-fit offsets in one arena. An elided
     * node's memory is live from the first kernel that writes into it. */
    int pos = 0;
    for (int i = 0; i < n; i++)
        if (p->kind[i] == K_SINGLE || p->kind[i] == K_ROOT || p->kind[i] == K_ELIDED)
            order[i] = pos++;
    for (int i = 0; i < n; i++) {
        if (p->kind[i] == K_MEMBER)
            order[i] = order[p->root_of[i]];
        if (p->fold[i] >= 0)
            order[p->fold[i]] = order[i];
        if (p->gate_mul[i] >= 0)
            order[p->gate_mul[i]] = order[i];
        last[i] = -1;
    }
    for (int i = 0; i < n; i++) {
        int into = p->alias_of[i] >= 0 ? p->alias_of[i] : p->rope_of[i];
        if (into >= 0 && order[i] < first[into])
            first[into] = order[i];
    }
    for (int i = 0; i < n; i++) {
        if (p->kind[i] == K_DEAD)
            continue;
        for (int k = 0; k < nodes[i]->n_in; k++) {
            int prod = producer_of(&nodes[i]->in[k]);
            if (prod >= 0 && order[i] > last[prod])
                last[prod] = order[i];
        }
    }
    for (int i = 0; i < n; i++) /* a folded pair's memory is the activation's output */
        if (p->fold[i] >= 0 && last[p->fold[i]] > last[i])
            last[i] = last[p->fold[i]];
    typedef struct { int64_t off, bytes; int begin, end; } placed;
    placed *pls = df_malloc(n1 * sizeof *pls);
    int np = 0;
    for (int i = 0; pls && i < n; i++) {
        const df_storage *out = nodes[p->fold[i] >= 0 ? p->fold[i] : i]->out.st;
        if ((p->kind[i] != K_SINGLE && p->kind[i] != K_ROOT && p->kind[i] != K_ELIDED) ||
            out->handles > 0 || p->alias_of[i] >= 0 || p->rope_of[i] >= 0)
            continue;
        int64_t bytes = p->half[result_node(p, i)] ? (int64_t)out->bytes / 2 : (int64_t)out->bytes;
        bytes = (bytes + 63) / 64 * 64;
        int begin = first[i] < order[i] ? first[i] : order[i];
        int end = last[i] < order[i] ? order[i] : last[i];
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
        p->offset[i] = off;
        if (off + bytes > p->arena_bytes)
            p->arena_bytes = off + bytes;
    }
    if (!pls) { /* no plan: every intermediate gets its own buffer */
        for (int i = 0; i < n; i++)
            p->offset[i] = -1;
        p->arena_bytes = 0;
    }
    df_free(pls);
done:
    df_free(uses);
    df_free(order);
    df_free(last);
    df_free(first);
    df_free(parent);
    df_free(is_head);
    return p;
}

void df_graph_plan_free(lz_program *p)
{
    if (!p)
        return;
    df_free(p->root_of);
    df_free(p->fold);
    df_free(p->gate_mul);
    df_free(p->epi_slots);
    df_free(p->alias_of);
    df_free(p->alias_off);
    df_free(p->alias_split);
    df_free(p->rope_of);
    df_free(p->rope_s0);
    df_free(p->half);
    df_free(p->kind);
    df_free(p->group);
    df_free(p->offset);
    df_free(p->groups);
    df_free(p);
}

/* ---- running a planned graph ------------------------------------------------------------- */

typedef struct fused_item {
    df_fused f;
    df_ctx *profile;
    df_node **owned; /* the group's nodes, freed when it has run */
    int n_owned;
} fused_item;

static df_status run_fused(void *arg, df_kernel_env *env)
{
    fused_item *it = arg;
    double t0 = it->profile ? df_now() : 0;
    df_status s = it->owned[0]->out.st->dev->ops->run_fused(&it->f, env);
    if (it->profile)
        df_profile_add(it->profile, DF_OP_COUNT, df_now() - t0);
    return s;
}

static void done_fused(void *arg, df_status s)
{
    fused_item *it = arg;
    if (s != DF_OK)
        df_error_context(s, "fused kernel of %d ops", it->n_owned);
    for (int i = 0; i < it->n_owned; i++)
        df_node_free(it->owned[i]);
    df_free(it->owned);
    df_free(it);
}

static df_status release_arena(void *arg, df_kernel_env *env)
{
    (void)arg;
    (void)env;
    return DF_OK;
}

static void done_arena(void *arg, df_status s)
{
    (void)s;
    df_storage_release(arg);
}

/* The context's arena, grown to at least `bytes`. A smaller one is released after the work
 * already queued (which may still use it); the new one is rounded up to 1 MiB so that
 * graphs of slightly different sizes do not each grow it. */
static df_status arena_for(df_ctx *ctx, int64_t bytes, df_storage **out)
{
    if (ctx->arena && (int64_t)ctx->arena->bytes >= bytes) {
        *out = ctx->arena;
        return DF_OK;
    }
    df_storage *old = ctx->arena;
    ctx->arena = NULL;
    if (old && ctx->dev->ops->stream_submit(
                   ctx->stream, &(df_work){.run = release_arena, .done = done_arena, .arg = old}) !=
                   DF_OK) {
        ctx->dev->ops->stream_sync(ctx->stream);
        df_storage_release(old);
    }
    int64_t mib = 1 << 20;
    DF_TRY(df_storage_alloc(ctx->dev, (size_t)((bytes + mib - 1) / mib * mib), &ctx->arena));
    *out = ctx->arena;
    return DF_OK;
}

static df_status submit_group(df_ctx *ctx, df_node **nodes, const lz_program *p,
                              const lz_group *g)
{
    fused_item *it = df_calloc(1, sizeof *it);
    if (it)
        it->owned = df_malloc((size_t)g->n_members * sizeof *it->owned);
    if (!it || !it->owned) {
        df_free(it);
        return df_errorf(DF_E_OOM, "out of memory queuing a fused kernel");
    }
    df_fused *f = &it->f;
    it->profile = ctx->profiling ? ctx : NULL;
    f->out = nodes[g->root]->out;
    f->n_in = g->n_in;
    for (int k = 0; k < g->n_in; k++)
        f->in[k] = nodes[g->in[k].node]->in[g->in[k].slot];
    f->n_insn = g->n_insn;
    f->n_regs = g->n_regs;
    f->out_reg = g->out_reg;
    f->head_op = -1;
    for (int k = 0; k < g->n_insn; k++) {
        f->insn[k] = g->insn[k];
        int src = g->insn_node[k];
        if (src >= 0 && g->insn[k].op == DF_FI_SCALE) {
            f->insn[k].f0 = (float)nodes[src]->a.f[0];
            f->insn[k].f1 = (float)nodes[src]->a.f[1];
        }
    }
    if (g->head >= 0) {
        const df_node *h = nodes[g->head];
        f->head_op = h->op;
        f->head_x = h->in[0];
        f->head_w = h->in[1];
        f->head_b = h->op == DF_OP_LAYER_NORM ? h->in[2] : (df_view){0};
        f->head_eps = (float)h->a.f[0];
    }
    for (int i = 0; i <= g->root; i++)
        if (i == g->root || p->root_of[i] == g->root)
            it->owned[it->n_owned++] = nodes[i];
    df_status s = ctx->dev->ops->stream_submit(
        ctx->stream, &(df_work){.run = run_fused, .done = done_fused, .arg = it});
    if (s != DF_OK) {
        done_fused(it, DF_OK);
        return s;
    }
    ctx->stats.ops_enqueued++;
    ctx->stats.fused_kernels++;
    return DF_OK;
}

/* Turns rms_norm node x into rms_norm_rope: it writes its rows, rotated, into the output
 * of `rope` from position s0 on, and its own output is never made. */
static void write_rotated(df_node *x, const df_node *rope, int64_t s0)
{
    int64_t S = x->out.shape[1], D = x->out.shape[3];
    df_view out = rope->out; /* [B, H, S_all, D] dense: this part is rows s0 .. s0 + S */
    out.shape[2] = S;
    out.offset += s0 * D;
    df_view table = rope->in[1]; /* [S_all, D/2, 2] */
    table.shape[0] = S;
    table.offset += s0 * table.stride[0];
    df_storage_retain(out.st);
    df_storage_retain(table.st);
    df_storage *own = x->out.st;
    own->producer = NULL;
    df_storage_release(own);
    x->op = DF_OP_RMS_NORM_ROPE;
    x->out = out;
    x->in[2] = table;
    x->n_in = 3;
}

/* Points node x's output at its columns of `whole` (a concat's output along its last
 * dimension), from column `col` on: x's trailing dimensions from `split` on stay dense
 * inside the part, the ones before step over whole rows. */
static void write_columns(df_node *x, const df_view *whole, int64_t col, int split)
{
    df_view v = x->out;
    int64_t stride = whole->shape[whole->ndim - 1];
    for (int d = split - 1; d >= 0; d--) {
        v.stride[d] = stride;
        stride *= v.shape[d];
    }
    v.st = whole->st;
    v.offset = whole->offset + col;
    df_storage_retain(v.st);
    df_storage *own = x->out.st;
    own->producer = NULL;
    df_storage_release(own);
    x->out = v;
}

df_status df_graph_execute(df_ctx *ctx, df_node **nodes, int n, const lz_program *p)
{
    df_status s = DF_OK;
    df_storage *arena = NULL;
    if (p->arena_bytes > 0)
        s = arena_for(ctx, p->arena_bytes, &arena);
    /* bf16 results: their kernels, the kernels writing parts of them, and their readers
     * see them as bf16 (before folding, so that a product takes its activation's view). */
    for (int j = 0; j < n; j++)
        for (int k = 0; k < nodes[j]->n_in; k++) {
            int q = producer_of(&nodes[j]->in[k]);
            if (q >= 0 && p->half[q])
                nodes[j]->in[k].dtype = DF_DTYPE_BF16;
        }
    for (int i = 0; i < n; i++) {
        if (p->alias_of[i] >= 0 && p->half[p->alias_of[i]]) {
            nodes[result_node(p, i)]->out.dtype = DF_DTYPE_BF16;
            nodes[result_node(p, i)]->out.st->bytes /= 2;
        }
        if (p->half[i]) {
            nodes[i]->out.dtype = DF_DTYPE_BF16;
            nodes[i]->out.st->bytes /= 2;
        }
    }
    /* Folded activations: the product writes the activation's output and applies it. */
    for (int i = 0; i < n; i++) {
        int j = p->fold[i];
        if (j < 0)
            continue;
        df_storage *own = nodes[i]->out.st;
        nodes[i]->out = nodes[j]->out;
        df_storage_retain(nodes[i]->out.st);
        nodes[i]->a.i[3] = activation_of(nodes[j]->op);
        int m = p->gate_mul[i];
        if (m >= 0) { /* the gate row from the mul, the residual from the add */
            df_node *x = nodes[i];
            x->in[3] = nodes[m]->in[p->epi_slots[i] & 1];
            x->in[4] = nodes[j]->in[p->epi_slots[i] >> 1 & 1];
            df_storage_retain(x->in[3].st);
            df_storage_retain(x->in[4].st);
            x->n_in = 5;
            x->a.i[4] = 1;
            nodes[m]->out.st->producer = NULL;
            df_node_free(nodes[m]);
            nodes[m] = NULL;
        }
        own->producer = NULL;
        df_storage_release(own);
        df_node_free(nodes[j]);
        nodes[j] = NULL;
    }
    /* Memory for every materialised output, then for the parts written in place, then the
     * kernels in order. */
    for (int i = 0; s == DF_OK && i < n; i++) {
        if ((p->kind[i] != K_SINGLE && p->kind[i] != K_ROOT && p->kind[i] != K_ELIDED) ||
            p->alias_of[i] >= 0 || p->rope_of[i] >= 0)
            continue;
        df_storage *st = nodes[i]->out.st;
        if (p->offset[i] >= 0) {
            st->data = (char *)arena->data + p->offset[i];
            st->external = true; /* the arena owns the memory */
        } else {
            s = df_storage_materialize(st);
        }
    }
    for (int i = 0; s == DF_OK && i < n; i++) {
        if (p->alias_of[i] >= 0 && p->alias_split[i] > 0) {
            write_columns(nodes[i], &nodes[p->alias_of[i]]->out, p->alias_off[i],
                          p->alias_split[i]);
        } else if (p->alias_of[i] >= 0) {
            df_storage *st = nodes[i]->out.st, *base = nodes[p->alias_of[i]]->out.st;
            st->data = (char *)base->data + (p->half[p->alias_of[i]] ? p->alias_off[i] / 2
                                                                       : p->alias_off[i]);
            st->external = true;
            st->base = base; /* kept until this part is freed, whoever drops the concat */
            df_storage_retain(base);
        } else if (p->rope_of[i] >= 0) {
            write_rotated(nodes[i], nodes[p->rope_of[i]], p->rope_s0[i]);
        }
    }
    for (int i = 0; i < n; i++)
        if (nodes[i])
            nodes[i]->out.st->producer = NULL;
    for (int i = 0; i < n; i++) {
        if (!nodes[i])
            continue; /* folded into its product */
        if (s != DF_OK || p->kind[i] == K_DEAD || p->kind[i] == K_ELIDED) {
            df_node_free(nodes[i]); /* never run: nothing reads it, or others write it */
            continue;
        }
        if (p->kind[i] == K_SINGLE)
            s = df_eager_submit(ctx, nodes[i]);
        else if (p->kind[i] == K_ROOT)
            s = submit_group(ctx, nodes, p, &p->groups[p->group[i]]);
        /* K_MEMBER nodes are owned by their group's kernel */
    }
    return s;
}

/* ---- the executor --------------------------------------------------------------------------- */

static df_status lazy_flush(df_ctx *ctx)
{
    lz_state *z = ctx->exec_state;
    if (!z || z->n == 0)
        return DF_OK;
    int n = z->n;
    df_node **nodes = z->nodes;
    z->nodes = NULL;
    z->n = z->cap = 0;
    ctx->stats.graphs_built++;
    uint64_t key = graph_key(nodes, n);
    lz_program *p = z->cache;
    while (p && (p->key != key || p->n != n))
        p = p->next;
    if (p) {
        ctx->stats.cache_hits++;
    } else {
        double t0 = df_now();
        p = df_graph_plan_make(nodes, n, ctx->dev->ops);
        ctx->stats.compile_ms += (df_now() - t0) * 1e3;
        ctx->stats.cache_misses++;
        ctx->stats.graphs_compiled++;
        if (!p) {
            for (int i = 0; i < n; i++)
                df_node_free(nodes[i]);
            df_free(nodes);
            return df_errorf(DF_E_OOM, "out of memory planning a graph of %d ops", n);
        }
        p->key = key;
        p->next = z->cache;
        z->cache = p;
    }
    if (p->arena_bytes > ctx->stats.arena_bytes)
        ctx->stats.arena_bytes = p->arena_bytes;
    df_status s = df_graph_execute(ctx, nodes, n, p);
    df_free(nodes);
    return s;
}

static df_status lazy_submit(df_ctx *ctx, df_node *node)
{
    lz_state *z = ctx->exec_state;
    if (!ctx->dev->ops->kernels[node->op]) {
        df_status s = df_errorf(DF_E_UNSUPPORTED, "op '%s' is not supported on %s",
                                df_op_name(node->op), ctx->dev->name);
        df_node_free(node);
        return s;
    }
    /* Cut before adding: the new node's handle does not exist yet, so it must not be
     * judged dead by the flush. */
    if (z->n >= ctx->fuse_max_nodes) {
        df_status s = lazy_flush(ctx);
        if (s != DF_OK) {
            df_node_free(node);
            return s;
        }
    }
    if (z->n == z->cap) {
        int cap = z->cap ? 2 * z->cap : 256;
        df_node **nn = df_realloc(z->nodes, (size_t)cap * sizeof *nn);
        if (!nn) {
            df_node_free(node);
            return df_errorf(DF_E_OOM, "out of memory recording op '%s'", df_op_name(node->op));
        }
        z->nodes = nn;
        z->cap = cap;
    }
    node->id = z->n;
    node->out.st->producer = node;
    z->nodes[z->n++] = node;
    return DF_OK;
}

static void lazy_destroy(df_ctx *ctx)
{
    lz_state *z = ctx->exec_state;
    if (!z)
        return;
    for (int i = 0; i < z->n; i++)
        df_node_free(z->nodes[i]);
    df_free(z->nodes);
    for (lz_program *p = z->cache, *next; p; p = next) {
        next = p->next;
        df_graph_plan_free(p);
    }
    df_free(z);
    ctx->exec_state = NULL;
}

static const df_executor exec_lazy = {
    .submit = lazy_submit,
    .flush = lazy_flush,
    .destroy = lazy_destroy,
};

df_status df_lazy_attach(df_ctx *ctx)
{
    lz_state *z = df_calloc(1, sizeof *z);
    if (!z)
        return df_errorf(DF_E_OOM, "out of memory");
    ctx->exec_state = z;
    ctx->exec = &exec_lazy;
    return DF_OK;
}

int64_t df_lazy_pending(const df_ctx *ctx)
{
    const lz_state *z = ctx->mode == DF_DEFER_AND_FUSE ? ctx->exec_state : NULL;
    return z ? z->n : 0;
}

int64_t df_graph_plan_arena(const lz_program *p)
{
    return p->arena_bytes;
}

int df_graph_plan_kernels(const lz_program *p)
{
    int k = 0;
    for (int i = 0; i < p->n; i++)
        k += p->kind[i] == K_SINGLE || p->kind[i] == K_ROOT;
    return k;
}
