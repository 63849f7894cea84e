/*
 * The device vocabulary (backend/ops.def) and the tables made from it: every capability
 * bit has its own bit and a word in df_device_caps_string; every product has the compute
 * attribute; the epilogue activations map to their ops and capability bits and back; and
 * the devices built into the library (cpu, sim) support exactly the ops their kernel
 * tables hold, which is every op but the runtime's own ALL_REDUCE, with a CPU row function
 * for every unary op that fused programs run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <diffuse/runtime.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/graph.h"

static const struct {
    uint32_t bit;
    const char *name, *word;
} caps[] = {
#define DF_CAP(name, bit, word, doc) {DF_CAP_##name, #name, word},
#include "backend/ops.def"
#undef DF_CAP
};
#define N_CAPS (sizeof caps / sizeof *caps)

static void test_every_capability_bit_has_its_own_bit_and_word(void **state)
{
    (void)state;
    uint32_t seen = 0;
    for (size_t i = 0; i < N_CAPS; i++) {
        char buf[64];
        if (seen & caps[i].bit)
            fail_msg("DF_CAP_%s reuses a bit", caps[i].name);
        seen |= caps[i].bit;
        df_device_caps_string(caps[i].bit, buf, sizeof buf);
        if (strcmp(buf, caps[i].word) != 0)
            fail_msg("DF_CAP_%s prints as '%s', expected '%s'", caps[i].name, buf, caps[i].word);
    }
    char all[1024];
    df_device_caps_string(seen, all, sizeof all);
    for (size_t i = 0; i < N_CAPS; i++)
        assert_non_null(strstr(all, caps[i].word));
    assert_null(strstr(all, "cap")); /* no bit left without a word */
    /* a bit this library does not know is still printed, by number */
    for (int b = 0; b < 32; b++) {
        if (seen >> b & 1u)
            continue;
        char buf[32], want[16];
        snprintf(want, sizeof want, "cap%d", b);
        assert_string_equal(df_device_caps_string(1u << b, buf, sizeof buf), want);
    }
}

static void test_the_int8_capability_is_named(void **state)
{
    (void)state;
    char buf[64];
    assert_string_equal(df_device_caps_string(DF_CAP_INT8, buf, sizeof buf), "int8");
}

static void test_every_product_has_the_compute_attribute(void **state)
{
    (void)state;
    for (int op = 0; op < DF_OP_COUNT; op++) {
        uint64_t a = df_vocab_op_attrs((df_op)op);
        assert_true(a < (UINT64_C(1) << DF_ATTR_COUNT));
        if (df_op_kind_of((df_op)op) == DF_OPK_MATMUL && !(a & DF_A(compute)))
            fail_msg("%s is a product without the compute attribute", df_op_name((df_op)op));
        if ((a & DF_A(compute)) && df_op_kind_of((df_op)op) != DF_OPK_MATMUL)
            fail_msg("%s has compute but is not of kind DF_OPK_MATMUL", df_op_name((df_op)op));
    }
    assert_int_equal(sizeof(df_attrs), DF_ATTR_COUNT * 8 + (DF_ATTR_MAX_AXES - 1) * 8);
}

static void test_epilogue_activations_map_to_ops_and_caps(void **state)
{
    (void)state;
    int acts = 0;
    for (int op = 0; op < DF_OP_COUNT; op++) {
        df_act act = df_vocab_act_of((df_op)op);
        if (act == DF_ACT_NONE)
            continue;
        acts++;
        assert_int_equal(df_vocab_act_op(act), op);
        assert_true(df_vocab_act_cap(act) != 0);
        assert_true(df_vocab_op_fuses((df_op)op)); /* an epilogue is a pointwise op */
        assert_int_equal(df_op_inputs((df_op)op), 1);
    }
    assert_int_equal(acts, DF_ACT_COUNT - 1); /* DF_ACT_ numbers are dense */
    assert_int_equal(df_vocab_act_op(DF_ACT_NONE), DF_OP_COUNT);
    assert_int_equal(df_vocab_act_cap(DF_ACT_NONE), 0);
    assert_int_equal(df_vocab_act_of(DF_OP_QUICK_GELU), DF_ACT_NONE); /* no epilogue bit */
}

static void test_fused_ops_are_pointwise_with_a_cpu_row_function(void **state)
{
    (void)state;
    for (int op = 0; op < DF_OP_COUNT; op++) {
        if (!df_vocab_op_fuses((df_op)op))
            continue;
        const char *name = df_op_name((df_op)op);
        if (df_op_kind_of((df_op)op) != DF_OPK_ELEMENTWISE || df_op_inputs((df_op)op) > 2)
            fail_msg("%s is marked fuse but is not an elementwise op of 1 or 2 inputs", name);
        bool binary = op == DF_OP_ADD || op == DF_OP_SUB || op == DF_OP_MUL || op == DF_OP_DIV;
        if (!binary && op != DF_OP_COPY && !df_cpu_unary_fns[op])
            fail_msg("%s is marked fuse but has no CPU row function (df_cpu_unary_fns)", name);
    }
}

/* supports() of the built-in devices against their table: every op with a kernel, none
 * without; both run every op but ALL_REDUCE (which the runtime performs itself). */
static void check_device(const char *name)
{
    df_device *dev;
    assert_int_equal(df_device_open(name, NULL, &dev), DF_OK);
    for (int op = 0; op < DF_OP_COUNT; op++) {
        bool has = df_dev_has_op(dev, (df_op)op), table = df_cpu_kernels[op] != NULL;
        if (has != table)
            fail_msg("%s: supports() says %d for %s, its kernel table %d", name, has,
                     df_op_name((df_op)op), table);
        assert_int_equal(has, op != DF_OP_ALL_REDUCE);
    }
    df_device_close(dev);
}

static void test_cpu_and_sim_support_what_their_table_holds(void **state)
{
    (void)state;
    check_device("cpu");
    check_device("sim");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_capability_bit_has_its_own_bit_and_word),
        cmocka_unit_test(test_the_int8_capability_is_named),
        cmocka_unit_test(test_every_product_has_the_compute_attribute),
        cmocka_unit_test(test_epilogue_activations_map_to_ops_and_caps),
        cmocka_unit_test(test_fused_ops_are_pointwise_with_a_cpu_row_function),
        cmocka_unit_test(test_cpu_and_sim_support_what_their_table_holds),
    };
    return cmocka_run_group_tests_name("device vocabulary", tests, NULL, NULL);
}
