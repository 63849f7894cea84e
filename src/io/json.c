/*
 * JSON documents: parsing with cJSON and navigation of the result.
 *
 * cJSON does the parsing; we then copy its tree into one block of our own (json.h) and free
 * cJSON's, because our nodes must remember their file, parent and key for messages, and
 * must index arrays in constant time and objects by binary search (cJSON walks lists).
 *
 * cJSON is lenient where a file from the internet must not be, so a scan before it rejects
 * invalid UTF-8, raw control characters inside strings and the escape \u0000 (cJSON would
 * silently cut the string there, so "a\u0000/../b" could hide a path), and after it we
 * reject duplicate keys and anything but whitespace after the value. cJSON keeps numbers
 * only as doubles, so while copying the tree we read each number again from its own text
 * (numbers appear in the text in the order we visit them): an integer literal keeps its
 * exact value up to 2^64 - 1 (seeds use all 64 bits), and a number that JSON's grammar does
 * not allow (cJSON lets "+1", "01", "1." and ".5" through) is a syntax error. cJSON allocates
 * through df_malloc (its hooks are set once, process-wide), so out-of-memory tests reach it
 * and a failed allocation inside it is reported as DF_E_OOM, not as a syntax error.
 */
#include "io/json.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/path.h"

/* ---- cJSON through df_malloc ------------------------------------------------------- */

static _Thread_local bool cjson_oom;

static void *cjson_malloc(size_t n)
{
    void *p = df_malloc(n);
    if (!p)
        cjson_oom = true;
    return p;
}

static void install_hooks(void)
{
    cJSON_Hooks hooks = {.malloc_fn = cjson_malloc, .free_fn = df_free};
    cJSON_InitHooks(&hooks);
}

static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;

/* ---- the scan before cJSON --------------------------------------------------------- */

static void line_col(const char *text, size_t pos, int64_t *line, int64_t *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < pos; i++) {
        if (text[i] == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

static df_status syntax_error(const char *name, const char *text, size_t len, size_t pos,
                              const char *what)
{
    if (pos > len)
        pos = len;
    int64_t line, col;
    line_col(text, pos, &line, &col);
    char near[24];
    size_t n = 0;
    for (size_t i = pos; i < len && n < 16; i++)
        near[n++] = (text[i] >= 0x20 && text[i] < 0x7f) ? text[i] : '?';
    near[n] = '\0';
    if (pos >= len)
        return df_errorf(DF_E_FORMAT, "%s:%lld:%lld: %s at the end of the text", name,
                         (long long)line, (long long)col, what);
    return df_errorf(DF_E_FORMAT, "%s:%lld:%lld: %s near '%s'", name, (long long)line,
                     (long long)col, what, near);
}

/* Length of the UTF-8 sequence at s (at most `left` bytes), or 0 when it is invalid. */
static size_t utf8_len(const unsigned char *s, size_t left)
{
    unsigned char c = s[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4;
    else
        return 0;
    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    if (left < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return n;
}

static df_status scan_strings(const char *text, size_t len, const char *name)
{
    const unsigned char *t = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        if (t[i] != '"') {
            i++;
            continue;
        }
        size_t start = i++;
        for (;;) {
            if (i >= len)
                return syntax_error(name, text, len, start, "unterminated string");
            unsigned char c = t[i];
            if (c == '"') {
                i++;
                break;
            }
            if (c < 0x20)
                return syntax_error(name, text, len, i, "control character inside a string");
            if (c == '\\') {
                if (i + 1 >= len)
                    return syntax_error(name, text, len, start, "unterminated string");
                if (t[i + 1] == 'u' && i + 6 <= len && memcmp(t + i + 2, "0000", 4) == 0)
                    return syntax_error(name, text, len, i,
                                        "NUL character (\\u0000) inside a string");
                i += 2;
                continue;
            }
            if (c >= 0x80) {
                size_t n = utf8_len(t + i, len - i);
                if (n == 0)
                    return syntax_error(name, text, len, i, "invalid UTF-8 inside a string");
                i += n;
                continue;
            }
            i++;
        }
    }
    return DF_OK;
}

/* ---- copying cJSON's tree into one block -------------------------------------------- */

typedef struct sizes {
    size_t nodes, members, chars;
} sizes;

static void count(const cJSON *c, sizes *z)
{
    z->nodes++;
    if (c->string)
        z->chars += strlen(c->string) + 1;
    if (cJSON_IsString(c))
        z->chars += strlen(c->valuestring) + 1;
    if (cJSON_IsObject(c) || cJSON_IsArray(c)) {
        for (const cJSON *k = c->child; k; k = k->next) {
            if (cJSON_IsObject(c))
                z->members++;
            count(k, z);
        }
    }
}

typedef struct filler {
    df_json *node;       /* next free node */
    const df_json **ptr; /* next free sorted-member slot */
    char *chars;         /* next free string byte */
    const char *source;
    const char *text; /* the document's text, for numbers */
    size_t len;
    size_t pos; /* where the search for the next number starts */
} filler;

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Skips the digits at s[*i..n); false when there is none. */
static bool digits(const char *s, size_t n, size_t *i)
{
    size_t start = *i;
    while (*i < n && is_digit(s[*i]))
        ++*i;
    return *i > start;
}

/*
 * Reads the n-byte number literal s into j: false when it breaks JSON's grammar
 * -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
 */
static bool read_number(const char *s, size_t n, df_json *j)
{
    size_t i = 0;
    j->v.number.negative = n > 0 && s[0] == '-';
    if (j->v.number.negative)
        i++;
    size_t int_start = i;
    if (!digits(s, n, &i) || (s[int_start] == '0' && i - int_start > 1))
        return false;
    size_t int_end = i;
    bool integer = true;
    if (i < n && s[i] == '.') {
        i++;
        integer = false;
        if (!digits(s, n, &i))
            return false;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        integer = false;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (!digits(s, n, &i))
            return false;
    }
    if (i != n)
        return false;
    uint64_t m = 0;
    for (size_t k = int_start; integer && k < int_end; k++) {
        uint64_t d = (uint64_t)(s[k] - '0');
        if (m > (UINT64_MAX - d) / 10)
            integer = false; /* 2^64 or more: only the double remains */
        else
            m = m * 10 + d;
    }
    j->v.number.integer = integer;
    j->v.number.magnitude = integer ? m : 0;
    return true;
}

/* Finds the next number literal of the text and reads it into j. */
static df_status next_number(filler *f, df_json *j)
{
    const char *t = f->text;
    size_t i = f->pos;
    while (i < f->len && !(is_digit(t[i]) || t[i] == '-' || t[i] == '+' || t[i] == '.')) {
        if (t[i] == '"') { /* strings were checked: each one ends */
            for (i++; i < f->len && t[i] != '"'; i++)
                if (t[i] == '\\')
                    i++;
        }
        i++;
    }
    size_t start = i;
    while (i < f->len && (is_digit(t[i]) || t[i] == '-' || t[i] == '+' || t[i] == '.' ||
                          t[i] == 'e' || t[i] == 'E'))
        i++;
    f->pos = i;
    if (start >= f->len || !read_number(t + start, i - start, j))
        return syntax_error(f->source, t, f->len, start, "invalid number");
    return DF_OK;
}

static const char *copy_str(filler *f, const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = f->chars;
    memcpy(d, s, n);
    f->chars += n;
    return d;
}

static int by_key(const void *a, const void *b)
{
    const df_json *x = *(const df_json *const *)a, *y = *(const df_json *const *)b;
    return strcmp(x->key, y->key);
}

static df_status fill(filler *f, df_json *j, const cJSON *c, const df_json *parent,
                      int64_t index)
{
    j->index = index;
    j->parent = parent;
    j->key = (parent && parent->type == DF_JSON_OBJECT) ? copy_str(f, c->string) : NULL;
    j->source = f->source;
    if (cJSON_IsNull(c)) {
        j->type = DF_JSON_NULL;
    } else if (cJSON_IsBool(c)) {
        j->type = DF_JSON_BOOL;
        j->v.boolean = cJSON_IsTrue(c);
    } else if (cJSON_IsNumber(c)) {
        j->type = DF_JSON_NUMBER;
        j->v.number.value = c->valuedouble;
        DF_TRY(next_number(f, j));
    } else if (cJSON_IsString(c)) {
        j->type = DF_JSON_STRING;
        j->v.string = copy_str(f, c->valuestring);
    } else {
        bool object = cJSON_IsObject(c);
        j->type = object ? DF_JSON_OBJECT : DF_JSON_ARRAY;
        int64_t n = 0;
        for (const cJSON *k = c->child; k; k = k->next)
            n++;
        j->v.list.n = n;
        j->v.list.items = f->node;
        j->v.list.sorted = NULL;
        f->node += n;
        int64_t i = 0;
        for (const cJSON *k = c->child; k; k = k->next, i++)
            DF_TRY(fill(f, &j->v.list.items[i], k, j, i));
        if (object && n > 0) {
            j->v.list.sorted = f->ptr;
            f->ptr += n;
            for (i = 0; i < n; i++)
                j->v.list.sorted[i] = &j->v.list.items[i];
            qsort(j->v.list.sorted, (size_t)n, sizeof *j->v.list.sorted, by_key);
            for (i = 1; i < n; i++) {
                if (strcmp(j->v.list.sorted[i - 1]->key, j->v.list.sorted[i]->key) == 0) {
                    char path[256];
                    df_json_path(j, path, sizeof path);
                    return df_errorf(DF_E_FORMAT, "%s: duplicate key '%s' in %s%s%s",
                                     f->source, j->v.list.sorted[i]->key,
                                     path[0] ? "object '" : "the top-level object",
                                     path, path[0] ? "'" : "");
                }
            }
        }
    }
    return DF_OK;
}

static size_t align_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

static df_status convert(const cJSON *root, const char *name, const char *text, size_t len,
                         df_json **out)
{
    sizes z = {0, 0, strlen(name) + 1};
    count(root, &z);
    size_t nodes_bytes, ptr_bytes, total;
    if (!df_size_mul(z.nodes, sizeof(df_json), &nodes_bytes) ||
        !df_size_mul(z.members, sizeof(df_json *), &ptr_bytes) ||
        !df_size_add(align_up(nodes_bytes, alignof(df_json *)), ptr_bytes, &total) ||
        !df_size_add(total, z.chars, &total))
        return df_errorf(DF_E_OOM, "%s: document too large", name);
    char *block = df_malloc(total);
    if (!block)
        return df_errorf(DF_E_OOM, "%s: out of memory for %zu JSON values", name, z.nodes);
    filler f = {
        .node = (df_json *)block,
        .ptr = (const df_json **)(block + align_up(nodes_bytes, alignof(df_json *))),
        .chars = block + align_up(nodes_bytes, alignof(df_json *)) + ptr_bytes,
        .text = text,
        .len = len,
    };
    f.source = copy_str(&f, name);
    df_json *top = f.node++;
    df_status s = fill(&f, top, root, NULL, 0);
    if (s != DF_OK) {
        df_free(block);
        return s;
    }
    *out = top;
    return DF_OK;
}

/* ---- parsing ---------------------------------------------------------------------- */

df_status df_json_parse_string(const char *text, size_t len, const char *name, df_json **out)
{
    if (!out)
        return df_errorf(DF_E_ARG, "df_json_parse_string: out is NULL");
    *out = NULL;
    if (!name)
        name = "<string>";
    if (!text)
        return df_errorf(DF_E_ARG, "df_json_parse_string: text is NULL");
    DF_TRY(scan_strings(text, len, name));

    pthread_once(&hooks_once, install_hooks);
    cjson_oom = false;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        if (cjson_oom)
            return df_errorf(DF_E_OOM, "%s: out of memory while parsing JSON", name);
        size_t pos = end ? (size_t)(end - text) : 0;
        return syntax_error(name, text, len, pos, "invalid JSON");
    }
    size_t pos = (size_t)(end - text);
    while (pos < len && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' ||
                         text[pos] == '\r'))
        pos++;
    df_status s = DF_OK;
    if (pos < len)
        s = syntax_error(name, text, len, pos, "unexpected text after the JSON value");
    if (s == DF_OK)
        s = convert(root, name, text, len, out);
    cJSON_Delete(root);
    return s;
}

df_status df_json_parse_file(const char *path, df_json **out)
{
    if (!out || !path)
        return df_errorf(DF_E_ARG, "df_json_parse_file: NULL argument");
    *out = NULL;
    char *text;
    size_t len;
    DF_TRY(df_file_read_all(path, DF_JSON_MAX_FILE, &text, &len));
    df_status s = df_json_parse_string(text, len, path, out);
    df_free(text);
    return s;
}

void df_json_free(df_json *root)
{
    if (root && !root->parent)
        df_free(root);
}

/* ---- navigation ------------------------------------------------------------------- */

const char *df_json_source(const df_json *j)
{
    return j ? j->source : "";
}

df_json_type df_json_type_of(const df_json *j)
{
    return j ? j->type : DF_JSON_NULL;
}

const char *df_json_type_name(df_json_type t)
{
    switch (t) {
    case DF_JSON_NULL:   return "null";
    case DF_JSON_BOOL:   return "boolean";
    case DF_JSON_NUMBER: return "number";
    case DF_JSON_STRING: return "string";
    case DF_JSON_ARRAY:  return "array";
    case DF_JSON_OBJECT: return "object";
    }
    return "?";
}

bool df_json_is_null(const df_json *j)
{
    return !j || j->type == DF_JSON_NULL;
}

/* Appends the path of j to buf[*n..cap), parents first. */
static void path_append(const df_json *j, char *buf, size_t cap, size_t *n)
{
    if (!j->parent)
        return;
    path_append(j->parent, buf, cap, n);
    if (*n >= cap)
        return;
    int w;
    if (j->key)
        w = snprintf(buf + *n, cap - *n, "%s%s", j->parent->parent ? "." : "", j->key);
    else
        w = snprintf(buf + *n, cap - *n, "[%lld]", (long long)j->index);
    *n += w > 0 ? (size_t)w : 0;
}

const char *df_json_path(const df_json *j, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return buf;
    buf[0] = '\0';
    size_t n = 0;
    if (j)
        path_append(j, buf, cap, &n);
    return buf;
}

const df_json *df_json_get(const df_json *obj, const char *key)
{
    if (!obj || !key || obj->type != DF_JSON_OBJECT)
        return NULL;
    int64_t lo = 0, hi = obj->v.list.n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(obj->v.list.sorted[mid]->key, key);
        if (c == 0)
            return obj->v.list.sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int64_t df_json_array_size(const df_json *arr)
{
    return arr && arr->type == DF_JSON_ARRAY ? arr->v.list.n : 0;
}

const df_json *df_json_array_get(const df_json *arr, int64_t i)
{
    if (!arr || arr->type != DF_JSON_ARRAY || i < 0 || i >= arr->v.list.n)
        return NULL;
    return &arr->v.list.items[i];
}

int64_t df_json_object_size(const df_json *obj)
{
    return obj && obj->type == DF_JSON_OBJECT ? obj->v.list.n : 0;
}

const df_json *df_json_object_at(const df_json *obj, int64_t i, const char **out_key)
{
    if (out_key)
        *out_key = NULL;
    if (!obj || obj->type != DF_JSON_OBJECT || i < 0 || i >= obj->v.list.n)
        return NULL;
    const df_json *m = &obj->v.list.items[i];
    if (out_key)
        *out_key = m->key;
    return m;
}

double df_json_number(const df_json *j)
{
    return j && j->type == DF_JSON_NUMBER ? j->v.number.value : 0.0;
}

const char *df_json_string(const df_json *j)
{
    return j && j->type == DF_JSON_STRING ? j->v.string : NULL;
}

bool df_json_bool(const df_json *j)
{
    return j && j->type == DF_JSON_BOOL && j->v.boolean;
}
