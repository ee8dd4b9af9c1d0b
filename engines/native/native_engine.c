/* native_engine: a synthetic token clock behind the tensorrt_llm engine contract, as a Triton backend in C.
 *
 * No model: every `step_ms` each model instance's one generation thread emits the next token of every
 * request in flight (a batched step, as in-flight batching steps its batch), so Triton's cost per
 * streamed response is the C API's, not the Python backend's stub round trip. The tokens are those of
 * the CPU reference engine's synthetic mode (model_repo_templates/tensorrt_llm/1/engine.py): token i of
 * a sequence is token_ids[splitmix64(base + i) % len(token_ids)], base = blake2b-64(prompt ids as int32
 * LE + seed as uint64 LE, person = sequence index 0). It is not TensorRT-LLM.
 *
 * Served: decoupled only; input_ids [1, N], input_lengths, request_output_len, end_id (ends without
 * being emitted, not before min_tokens), min_tokens/min_length, seed/random_seed, streaming (one response
 * per token then an empty final one; otherwise one whole response), exclude_input_in_output (request
 * input, else the model parameter), stop_words_list (ends after a match, the word kept), beam_width 1,
 * `stop` (ends the in-flight requests with the same id, on any instance of the model), cancellation.
 * Anything else is refused: inputs the config does not declare by Triton, bad values by an error response.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "triton_api.h"

#define ENGINE_NAME "native_engine"
#define MAX_INSTANCES 256

/* ------------------------------------------------------------------------------------------ helpers */

static void log_msg(TRITONSERVER_LogLevel level, int line, const char* fmt, ...) {
    char text[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    TRITONSERVER_Error* err = TRITONSERVER_LogMessage(level, __FILE__, line, text);
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
}
#define LOG_INFO(...) log_msg(TRITONSERVER_LOG_INFO, __LINE__, __VA_ARGS__)
#define LOG_ERROR(...) log_msg(TRITONSERVER_LOG_ERROR, __LINE__, __VA_ARGS__)

static TRITONSERVER_Error* error_new(TRITONSERVER_Error_Code code, const char* fmt, ...) {
    char text[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    return TRITONSERVER_ErrorNew(code, text);
}

/* A call whose failure only matters to the log (sending to a client that is gone, say). */
static void ignore(TRITONSERVER_Error* err, int line) {
    if (err != NULL) {
        log_msg(TRITONSERVER_LOG_VERBOSE, line, "%s", TRITONSERVER_ErrorMessage(err));
        TRITONSERVER_ErrorDelete(err);
    }
}
#define IGNORE(call) ignore((call), __LINE__)

static uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t deadline_ns) {
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                          .tv_nsec = (long)(deadline_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* ------------------------------------------------------------------------------- the token function */

static uint64_t splitmix64(uint64_t value) {
    value += 0x9E3779B97F4A7C15ull;
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ull;
    value = (value ^ (value >> 27)) * 0x94D049BB133111EBull;
    return value ^ (value >> 31);
}

/* BLAKE2b (RFC 7693), unkeyed, 8-byte digest, zero salt and personalisation: what Python's
 * hashlib.blake2b(data, digest_size=8, person=(0).to_bytes(4, "little")) computes. */
static const uint64_t blake2b_iv[8] = {
    0x6A09E667F3BCC908ull, 0xBB67AE8584CAA73Bull, 0x3C6EF372FE94F82Bull, 0xA54FF53A5F1D36F1ull,
    0x510E527FADE682D1ull, 0x9B05688C2B3E6C1Full, 0x1F83D9ABFB41BD6Bull, 0x5BE0CD19137E2179ull};
static const uint8_t blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

static uint64_t rotr64(uint64_t x, unsigned n) { return (x >> n) | (x << (64 - n)); }

static void blake2b_compress(uint64_t h[8], const uint8_t block[128], uint64_t counter, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++) {
        uint64_t word = 0;
        for (int b = 7; b >= 0; b--) word = (word << 8) | block[i * 8 + b];
        m[i] = word;
    }
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = blake2b_iv[i];
    }
    v[12] ^= counter;
    if (last) v[14] = ~v[14];
#define G(a, b, c, d, x, y)              \
    do {                                 \
        v[a] = v[a] + v[b] + (x);        \
        v[d] = rotr64(v[d] ^ v[a], 32);  \
        v[c] = v[c] + v[d];              \
        v[b] = rotr64(v[b] ^ v[c], 24);  \
        v[a] = v[a] + v[b] + (y);        \
        v[d] = rotr64(v[d] ^ v[a], 16);  \
        v[c] = v[c] + v[d];              \
        v[b] = rotr64(v[b] ^ v[c], 63);  \
    } while (0)
    for (int r = 0; r < 12; r++) {
        const uint8_t* s = blake2b_sigma[r];
        G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
#undef G
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

/* base = blake2b-64(prompt as int32 LE, then seed as uint64 LE), read as a little-endian integer. */
static uint64_t synthetic_base(const int32_t* prompt, size_t length, uint64_t seed) {
    uint64_t h[8];
    memcpy(h, blake2b_iv, sizeof h);
    h[0] ^= 0x01010000ull ^ 8u; /* fanout 1, depth 1, no key, 8-byte digest */
    size_t total = length * 4 + 8, done = 0;
    uint8_t block[128];
    size_t filled = 0;
    for (size_t i = 0; i < total; i++) {
        if (filled == 128) {
            /* A full block is compressed only once more data follows: the last one is flagged. */
            done += 128;
            blake2b_compress(h, block, done, 0);
            filled = 0;
        }
        uint8_t byte;
        if (i < length * 4) {
            uint32_t word = (uint32_t)prompt[i / 4];
            byte = (uint8_t)(word >> (8 * (i % 4)));
        } else {
            byte = (uint8_t)(seed >> (8 * (i - length * 4)));
        }
        block[filled++] = byte;
    }
    memset(block + filled, 0, 128 - filled);
    blake2b_compress(h, block, done + filled, 1);
    return h[0];
}

/* --------------------------------------------------------------------------------- the model config */

/* A few lookups in the model config's JSON: skip a value, find a key of an object. Triton writes the
 * JSON itself, so it is well formed; a malformed one makes the lookups fail, never read past the end. */
static const char* json_ws(const char* p, const char* end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

static const char* json_skip_string(const char* p, const char* end) {
    for (p++; p < end; p++) {
        if (*p == '\\')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return end;
}

static const char* json_skip(const char* p, const char* end) {
    p = json_ws(p, end);
    if (p >= end) return end;
    if (*p == '"') return json_skip_string(p, end);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (p < end) {
            if (*p == '"') {
                p = json_skip_string(p, end);
                continue;
            }
            if (*p == '{' || *p == '[') depth++;
            if (*p == '}' || *p == ']') {
                depth--;
                if (depth == 0) return p + 1;
            }
            p++;
        }
        return end;
    }
    while (p < end && *p != ',' && *p != '}' && *p != ']') p++;
    return p;
}

/* The value of `key` in the object starting at `p`, or NULL. */
static const char* json_get(const char* p, const char* end, const char* key) {
    p = json_ws(p, end);
    if (p >= end || *p != '{') return NULL;
    p++;
    size_t key_length = strlen(key);
    while (1) {
        p = json_ws(p, end);
        if (p >= end || *p != '"') return NULL;
        const char* name = p + 1;
        const char* name_end = json_skip_string(p, end) - 1;
        p = json_ws(name_end + 1, end);
        if (p >= end || *p != ':') return NULL;
        p = json_ws(p + 1, end);
        if ((size_t)(name_end - name) == key_length && memcmp(name, key, key_length) == 0) return p;
        p = json_ws(json_skip(p, end), end);
        if (p >= end || *p != ',') return NULL;
        p++;
    }
}

/* parameters[key].string_value copied into out (NUL-terminated), or NULL when absent. */
static char* config_parameter(const char* json, const char* end, const char* key) {
    const char* params = json_get(json, end, "parameters");
    const char* param = params ? json_get(params, end, key) : NULL;
    const char* value = param ? json_get(param, end, "string_value") : NULL;
    if (value == NULL || *value != '"') return NULL;
    const char* stop = json_skip_string(value, end) - 1;
    size_t length = (size_t)(stop - value - 1);
    char* out = malloc(length + 1);
    if (out == NULL) return NULL;
    memcpy(out, value + 1, length);
    out[length] = '\0';
    return out;
}

static int parse_bool(const char* text, int* out) {
    static const char* truthy[] = {"true", "1", "yes", "on"};
    static const char* falsy[] = {"false", "0", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(text, truthy[i]) == 0) return *out = 1, 0;
        if (strcasecmp(text, falsy[i]) == 0) return *out = 0, 0;
    }
    return -1;
}

/* "3-250,252,300-4095" -> the ids, in order. */
static int parse_token_ids(const char* text, int32_t** ids, size_t* count) {
    size_t capacity = 1024, n = 0;
    int32_t* out = malloc(capacity * sizeof *out);
    if (out == NULL) return -1;
    const char* p = text;
    while (*p) {
        char* next;
        long first = strtol(p, &next, 10), last;
        if (next == p || first < 0) goto bad;
        p = next;
        last = first;
        if (*p == '-') {
            last = strtol(p + 1, &next, 10);
            if (next == p + 1 || last < first) goto bad;
            p = next;
        }
        if (last > INT32_MAX) goto bad;
        for (long id = first; id <= last; id++) {
            if (n == capacity) {
                capacity *= 2;
                int32_t* grown = realloc(out, capacity * sizeof *out);
                if (grown == NULL) goto bad;
                out = grown;
            }
            out[n++] = (int32_t)id;
        }
        if (*p == ',') p++;
        else if (*p) goto bad;
    }
    if (n == 0) goto bad;
    *ids = out;
    *count = n;
    return 0;
bad:
    free(out);
    return -1;
}

/* ------------------------------------------------------------------------------------------- state */

typedef struct Sequence {
    struct Sequence* next;
    TRITONBACKEND_ResponseFactory* factory;
    char* id;
    uint64_t base;
    int32_t* prompt; /* kept only for a whole result that repeats it */
    size_t prompt_length;
    int32_t* generated;
    size_t generated_count, generated_capacity;
    int64_t max_new;
    int64_t end_id; /* < 0: none */
    int64_t min_tokens;
    int32_t* stop_ids; /* stop words, concatenated */
    int32_t* stop_ends; /* each word's end offset in stop_ids */
    size_t stop_words;
    int streaming, exclude_input, want_ids, want_length;
    size_t unsent;
    int finished;
} Sequence;

typedef struct StopId {
    struct StopId* next;
    char* id;
} StopId;

struct ModelState;

typedef struct InstanceState {
    struct ModelState* model;
    char name[128];
    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int running;
    Sequence* pending; /* submitted, newest first (reversed when admitted) */
    StopId* stops;
    Sequence* active; /* owned by the generation thread */
    uint64_t steps, tokens, completed, cancelled;
} InstanceState;

/* Prometheus metrics on Triton's metrics port, labelled with the model's name. */
enum { METRIC_ACTIVE, METRIC_TOKENS, METRIC_COMPLETED, METRIC_CANCELLED, METRIC_COUNT };
static const struct {
    const char* name;
    const char* description;
    TRITONSERVER_MetricKind kind;
} metric_specs[METRIC_COUNT] = {
    {"native_engine_active_requests", "Requests in flight in the native engine", TRITONSERVER_METRIC_KIND_GAUGE},
    {"native_engine_generated_tokens_total", "Tokens the native engine generated", TRITONSERVER_METRIC_KIND_COUNTER},
    {"native_engine_completed_requests_total", "Requests the native engine completed",
     TRITONSERVER_METRIC_KIND_COUNTER},
    {"native_engine_cancelled_requests_total", "Requests cancelled or stopped before their end",
     TRITONSERVER_METRIC_KIND_COUNTER},
};

typedef struct ModelState {
    char name[128];
    TRITONSERVER_MetricFamily* families[METRIC_COUNT];
    TRITONSERVER_Metric* metrics[METRIC_COUNT];
    uint64_t step_ns;
    int exclude_input_default;
    int32_t* token_ids;
    size_t token_count;
    pthread_mutex_t lock;
    InstanceState* instances[MAX_INSTANCES];
    size_t instance_count;
} ModelState;

static void metric_add(ModelState* model, int which, double value) {
    if (model->metrics[which] != NULL && value != 0) IGNORE(TRITONSERVER_MetricIncrement(model->metrics[which], value));
}

static TRITONSERVER_Error* metrics_create(ModelState* model) {
    TRITONSERVER_Parameter* label = TRITONSERVER_ParameterNew("model", TRITONSERVER_PARAMETER_STRING, model->name);
    if (label == NULL) return error_new(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    const TRITONSERVER_Parameter* labels[1] = {label};
    TRITONSERVER_Error* err = NULL;
    for (int i = 0; i < METRIC_COUNT && err == NULL; i++) {
        err = TRITONSERVER_MetricFamilyNew(&model->families[i], metric_specs[i].kind, metric_specs[i].name,
                                           metric_specs[i].description);
        if (err == NULL) err = TRITONSERVER_MetricNew(&model->metrics[i], model->families[i], labels, 1);
    }
    TRITONSERVER_ParameterDelete(label);
    return err;
}

static void metrics_delete(ModelState* model) {
    for (int i = 0; i < METRIC_COUNT; i++) {
        if (model->metrics[i] != NULL) IGNORE(TRITONSERVER_MetricDelete(model->metrics[i]));
        if (model->families[i] != NULL) IGNORE(TRITONSERVER_MetricFamilyDelete(model->families[i]));
        model->metrics[i] = NULL;
        model->families[i] = NULL;
    }
}

static void sequence_free(Sequence* seq) {
    if (seq->factory != NULL) IGNORE(TRITONBACKEND_ResponseFactoryDelete(seq->factory));
    free(seq->id);
    free(seq->prompt);
    free(seq->generated);
    free(seq->stop_ids);
    free(seq->stop_ends);
    free(seq);
}

/* ------------------------------------------------------------------------------------------ inputs */

/* The input's data, contiguous (copied when Triton holds it in several buffers): NULL and *err set when
 * it is malformed, NULL and no error when the request does not carry it. */
typedef struct {
    void* data;
    size_t count; /* elements */
    int64_t shape[4];
    uint32_t dims;
} Tensor;

static TRITONSERVER_Error* read_input(TRITONBACKEND_Request* request, const char* name,
                                      TRITONSERVER_DataType want, size_t element, Tensor* out) {
    memset(out, 0, sizeof *out);
    TRITONBACKEND_Input* input;
    TRITONSERVER_Error* err = TRITONBACKEND_RequestInput(request, name, &input);
    if (err != NULL) {
        TRITONSERVER_ErrorDelete(err); /* not sent */
        return NULL;
    }
    TRITONSERVER_DataType dtype;
    const int64_t* shape;
    uint32_t dims, buffers;
    uint64_t bytes;
    err = TRITONBACKEND_InputProperties(input, NULL, &dtype, &shape, &dims, &bytes, &buffers);
    if (err != NULL) return err;
    if (dtype != want)
        return error_new(TRITONSERVER_ERROR_INVALID_ARG, "%s has data type %d, expected %d", name, (int)dtype,
                         (int)want);
    if (dims > 4) return error_new(TRITONSERVER_ERROR_INVALID_ARG, "%s has %u dimensions", name, dims);
    if (bytes % element != 0)
        return error_new(TRITONSERVER_ERROR_INVALID_ARG, "%s holds %llu bytes", name, (unsigned long long)bytes);
    out->dims = dims;
    for (uint32_t i = 0; i < dims; i++) out->shape[i] = shape[i];
    out->count = bytes / element;
    out->data = malloc(bytes ? bytes : 1);
    if (out->data == NULL) return error_new(TRITONSERVER_ERROR_INTERNAL, "out of memory reading %s", name);
    uint64_t copied = 0;
    for (uint32_t b = 0; b < buffers; b++) {
        const void* buffer;
        uint64_t size;
        TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
        int64_t memory_id = 0;
        err = TRITONBACKEND_InputBuffer(input, b, &buffer, &size, &memory, &memory_id);
        if (err == NULL && memory == TRITONSERVER_MEMORY_GPU)
            err = error_new(TRITONSERVER_ERROR_INVALID_ARG, "%s is in GPU memory", name);
        if (err == NULL && copied + size > bytes)
            err = error_new(TRITONSERVER_ERROR_INVALID_ARG, "%s is larger than declared", name);
        if (err != NULL) {
            free(out->data);
            out->data = NULL;
            return err;
        }
        memcpy((char*)out->data + copied, buffer, size);
        copied += size;
    }
    return NULL;
}

/* A scalar input (one element), into *value; *given says whether the request carried it. */
static TRITONSERVER_Error* read_scalar(TRITONBACKEND_Request* request, const char* name,
                                       TRITONSERVER_DataType dtype, int64_t* value, int* given) {
    size_t element = dtype == TRITONSERVER_TYPE_BOOL ? 1 : dtype == TRITONSERVER_TYPE_UINT64 ? 8 : 4;
    Tensor t;
    TRITONSERVER_Error* err = read_input(request, name, dtype, element, &t);
    if (err != NULL) return err;
    if (t.data == NULL) return NULL;
    if (t.count != 1) {
        free(t.data);
        return error_new(TRITONSERVER_ERROR_INVALID_ARG,
                         "%s must hold one value (the native engine serves a batch of 1), got %zu", name,
                         t.count);
    }
    if (dtype == TRITONSERVER_TYPE_BOOL)
        *value = *(const uint8_t*)t.data != 0;
    else if (dtype == TRITONSERVER_TYPE_UINT64)
        *value = (int64_t) * (const uint64_t*)t.data;
    else
        *value = *(const int32_t*)t.data;
    *given = 1;
    free(t.data);
    return NULL;
}

/* The first of `names` the request carries (names drift between TensorRT-LLM versions). */
static TRITONSERVER_Error* read_scalar_any(TRITONBACKEND_Request* request, const char* first, const char* second,
                                           TRITONSERVER_DataType dtype, int64_t* value, int* given) {
    TRITONSERVER_Error* err = read_scalar(request, first, dtype, value, given);
    if (err != NULL || *given) return err;
    return read_scalar(request, second, dtype, value, given);
}

/* The request as a Sequence, or an error saying what is wrong with it. */
static TRITONSERVER_Error* parse_request(ModelState* model, TRITONBACKEND_Request* request, Sequence* seq) {
    TRITONSERVER_Error* err;
    int64_t value = 0;
    int given = 0;
    Tensor ids;
    if ((err = read_input(request, "input_ids", TRITONSERVER_TYPE_INT32, 4, &ids)) != NULL) return err;
    if (ids.data == NULL) return error_new(TRITONSERVER_ERROR_INVALID_ARG, "input_ids is required");
    if (ids.dims != 2 || ids.shape[0] != 1) {
        free(ids.data);
        return error_new(TRITONSERVER_ERROR_INVALID_ARG,
                         "input_ids must have shape [1, tokens]: the native engine serves one sequence per "
                         "request");
    }
    seq->prompt = ids.data;
    if ((err = read_scalar(request, "input_lengths", TRITONSERVER_TYPE_INT32, &value, &given)) != NULL) return err;
    if (!given) return error_new(TRITONSERVER_ERROR_INVALID_ARG, "input_lengths is required");
    if (value < 1 || (size_t)value > ids.count)
        return error_new(TRITONSERVER_ERROR_INVALID_ARG, "input_lengths %lld does not fit input_ids of width %zu",
                         (long long)value, ids.count);
    seq->prompt_length = (size_t)value;
    given = 0;
    if ((err = read_scalar(request, "request_output_len", TRITONSERVER_TYPE_INT32, &value, &given)) != NULL)
        return err;
    if (!given) return error_new(TRITONSERVER_ERROR_INVALID_ARG, "request_output_len is required");
    if (value < 1)
        return error_new(TRITONSERVER_ERROR_INVALID_ARG, "request_output_len must be >= 1, got %lld",
                         (long long)value);
    seq->max_new = value;
    given = 0;
    if ((err = read_scalar(request, "beam_width", TRITONSERVER_TYPE_INT32, &value, &given)) != NULL) return err;
    if (given && value != 1)
        return error_new(TRITONSERVER_ERROR_INVALID_ARG,
                         "beam_width %lld requested: the native engine only does beam_width 1", (long long)value);
    given = 0;
    seq->end_id = -1;
    if ((err = read_scalar(request, "end_id", TRITONSERVER_TYPE_INT32, &value, &given)) != NULL) return err;
    if (given) seq->end_id = value < 0 ? -1 : value;
    given = 0;
    if ((err = read_scalar_any(request, "min_tokens", "min_length", TRITONSERVER_TYPE_INT32, &value, &given)) !=
        NULL)
        return err;
    if (given && value < 0)
        return error_new(TRITONSERVER_ERROR_INVALID_ARG, "min_tokens must be >= 0, got %lld", (long long)value);
    seq->min_tokens = given ? value : 0;
    given = 0;
    uint64_t seed = 0;
    if ((err = read_scalar_any(request, "seed", "random_seed", TRITONSERVER_TYPE_UINT64, &value, &given)) != NULL)
        return err;
    if (given) seed = (uint64_t)value;
    given = 0;
    if ((err = read_scalar(request, "streaming", TRITONSERVER_TYPE_BOOL, &value, &given)) != NULL) return err;
    seq->streaming = given && value;
    given = 0;
    if ((err = read_scalar(request, "exclude_input_in_output", TRITONSERVER_TYPE_BOOL, &value, &given)) != NULL)
        return err;
    seq->exclude_input = given ? (int)value : model->exclude_input_default;

    Tensor words;
    if ((err = read_input(request, "stop_words_list", TRITONSERVER_TYPE_INT32, 4, &words)) != NULL) return err;
    if (words.data != NULL) {
        /* [1, 2, N]: row 0 the concatenated ids, row 1 each word's end offset, padded with -1. */
        const int32_t* rows = words.data;
        size_t width = words.count / 2;
        int shaped = words.dims == 3 && words.shape[0] == 1 && words.shape[1] == 2;
        if (!shaped || words.count % 2 != 0) {
            free(words.data);
            return error_new(TRITONSERVER_ERROR_INVALID_ARG, "stop_words_list must have shape [1, 2, N]");
        }
        seq->stop_ids = malloc((width ? width : 1) * sizeof(int32_t));
        seq->stop_ends = malloc((width ? width : 1) * sizeof(int32_t));
        if (seq->stop_ids == NULL || seq->stop_ends == NULL) {
            free(words.data);
            return error_new(TRITONSERVER_ERROR_INTERNAL, "out of memory");
        }
        memcpy(seq->stop_ids, rows, width * sizeof(int32_t));
        int32_t previous = 0;
        for (size_t i = 0; i < width && rows[width + i] >= 0; i++) {
            int32_t end = rows[width + i];
            if (end <= previous || (size_t)end > width) {
                free(words.data);
                return error_new(TRITONSERVER_ERROR_INVALID_ARG, "stop_words_list offsets are malformed");
            }
            seq->stop_ends[seq->stop_words++] = previous = end;
        }
        free(words.data);
    }

    uint32_t outputs = 0;
    if ((err = TRITONBACKEND_RequestOutputCount(request, &outputs)) != NULL) return err;
    for (uint32_t i = 0; i < outputs; i++) {
        const char* name;
        if ((err = TRITONBACKEND_RequestOutputName(request, i, &name)) != NULL) return err;
        if (strcmp(name, "output_ids") == 0) seq->want_ids = 1;
        if (strcmp(name, "sequence_length") == 0) seq->want_length = 1;
    }
    const char* id = NULL;
    if ((err = TRITONBACKEND_RequestId(request, &id)) != NULL) return err;
    seq->id = strdup(id ? id : "");
    seq->base = synthetic_base(seq->prompt, seq->prompt_length, seed);
    if (seq->streaming || seq->exclude_input) {
        free(seq->prompt);
        seq->prompt = NULL;
    }
    seq->generated_capacity = seq->max_new < 64 ? (size_t)seq->max_new : 64;
    seq->generated = malloc(seq->generated_capacity * sizeof(int32_t));
    if (seq->id == NULL || seq->generated == NULL) return error_new(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    return NULL;
}

/* ------------------------------------------------------------------------------------------ sending */

/* One response with the outputs asked for: output_ids [1, 1, n], sequence_length [1, 1]. */
static TRITONSERVER_Error* send_tokens(Sequence* seq, const int32_t* head, size_t head_count, const int32_t* tokens,
                                       size_t count, uint32_t flags) {
    TRITONBACKEND_Response* response;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNewFromFactory(&response, seq->factory);
    if (err != NULL) return err;
    size_t total = head_count + count;
    if (seq->want_ids) {
        int64_t shape[3] = {1, 1, (int64_t)total};
        TRITONBACKEND_Output* output;
        void* buffer;
        TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
        int64_t memory_id = 0;
        err = TRITONBACKEND_ResponseOutput(response, &output, "output_ids", TRITONSERVER_TYPE_INT32, shape, 3);
        if (err == NULL) err = TRITONBACKEND_OutputBuffer(output, &buffer, total * 4, &memory, &memory_id);
        if (err == NULL && total) {
            memcpy(buffer, head, head_count * 4);
            memcpy((char*)buffer + head_count * 4, tokens, count * 4);
        }
    }
    if (err == NULL && seq->want_length) {
        int64_t shape[2] = {1, 1};
        TRITONBACKEND_Output* output;
        void* buffer;
        TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
        int64_t memory_id = 0;
        err = TRITONBACKEND_ResponseOutput(response, &output, "sequence_length", TRITONSERVER_TYPE_INT32, shape, 2);
        if (err == NULL) err = TRITONBACKEND_OutputBuffer(output, &buffer, 4, &memory, &memory_id);
        if (err == NULL) *(int32_t*)buffer = (int32_t)total;
    }
    if (err != NULL) {
        IGNORE(TRITONBACKEND_ResponseDelete(response));
        return err;
    }
    return TRITONBACKEND_ResponseSend(response, flags, NULL);
}

/* An error response that ends the request. */
static void send_error(TRITONBACKEND_ResponseFactory* factory, TRITONSERVER_Error* error) {
    TRITONBACKEND_Response* response;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNewFromFactory(&response, factory);
    if (err == NULL) {
        IGNORE(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error));
    } else {
        IGNORE(err);
        IGNORE(TRITONBACKEND_ResponseFactorySendFlags(factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
    }
    TRITONSERVER_ErrorDelete(error);
}

/* -------------------------------------------------------------------------------------------- steps */

static int ends_with_stop_word(const Sequence* seq) {
    size_t start = 0;
    for (size_t w = 0; w < seq->stop_words; w++) {
        size_t end = (size_t)seq->stop_ends[w], length = end - start;
        if (length <= seq->generated_count &&
            memcmp(seq->generated + seq->generated_count - length, seq->stop_ids + start, length * 4) == 0)
            return 1;
        start = end;
    }
    return 0;
}

static void accept_next(const ModelState* model, Sequence* seq) {
    uint64_t position = seq->generated_count;
    uint64_t index = splitmix64(seq->base + position) % model->token_count;
    int32_t token = model->token_ids[index];
    if (seq->end_id >= 0 && token == seq->end_id) {
        if ((int64_t)seq->generated_count >= seq->min_tokens) {
            seq->finished = 1; /* like TensorRT-LLM, the end token is not part of the output */
            return;
        }
        /* min_tokens bans the end token until reached: the next id stands in for it. */
        token = model->token_ids[(index + 1) % model->token_count];
    }
    if (seq->generated_count == seq->generated_capacity) {
        size_t capacity = seq->generated_capacity * 2;
        if (capacity > (size_t)seq->max_new) capacity = (size_t)seq->max_new;
        int32_t* grown = realloc(seq->generated, capacity * sizeof(int32_t));
        if (grown == NULL) {
            seq->finished = 1;
            return;
        }
        seq->generated = grown;
        seq->generated_capacity = capacity;
    }
    seq->generated[seq->generated_count++] = token;
    seq->unsent++;
    if ((int64_t)seq->generated_count >= seq->max_new || ends_with_stop_word(seq)) seq->finished = 1;
}

static int stopped(const StopId* stops, const char* id) {
    if (id[0] == '\0') return 0;
    for (; stops != NULL; stops = stops->next)
        if (strcmp(stops->id, id) == 0) return 1;
    return 0;
}

static int cancelled(Sequence* seq) {
    bool is_cancelled = false;
    IGNORE(TRITONBACKEND_ResponseFactoryIsCancelled(seq->factory, &is_cancelled));
    return is_cancelled;
}

/* Send what the step produced; returns 1 when the request is over (its final flag sent). */
static int emit(Sequence* seq) {
    TRITONSERVER_Error* err = NULL;
    if (seq->streaming) {
        if (seq->unsent)
            err = send_tokens(seq, NULL, 0, seq->generated + seq->generated_count - seq->unsent, seq->unsent, 0);
        seq->unsent = 0;
        if (err == NULL && seq->finished)
            err = TRITONBACKEND_ResponseFactorySendFlags(seq->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL);
    } else if (seq->finished) {
        size_t head = seq->prompt ? seq->prompt_length : 0;
        err = send_tokens(seq, seq->prompt, head, seq->generated, seq->generated_count,
                          TRITONSERVER_RESPONSE_COMPLETE_FINAL);
    }
    if (err != NULL) {
        /* The client is gone or the response could not be built: the request cannot go on. */
        IGNORE(err);
        IGNORE(TRITONBACKEND_ResponseFactorySendFlags(seq->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
        return 1;
    }
    return seq->finished;
}

static void step(InstanceState* inst) {
    ModelState* model = inst->model;
    pthread_mutex_lock(&inst->lock);
    Sequence* arrived = inst->pending;
    StopId* stops = inst->stops;
    inst->pending = NULL;
    inst->stops = NULL;
    pthread_mutex_unlock(&inst->lock);

    /* Arrivals in submission order, behind the running sequences. */
    Sequence* admitted = NULL;
    while (arrived != NULL) {
        Sequence* next = arrived->next;
        arrived->next = admitted;
        admitted = arrived;
        arrived = next;
    }
    Sequence** link = &inst->active;
    while (*link != NULL) link = &(*link)->next;
    *link = admitted;
    uint64_t arrivals = 0, tokens = 0, completed = 0, cancelled_now = 0;
    for (Sequence* seq = admitted; seq != NULL; seq = seq->next) arrivals++;

    link = &inst->active;
    while (*link != NULL) {
        Sequence* seq = *link;
        int over;
        if (cancelled(seq) || stopped(stops, seq->id)) {
            /* A cancelled or stopped request ends now with what it has sent. */
            IGNORE(TRITONBACKEND_ResponseFactorySendFlags(seq->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
            cancelled_now++;
            over = 1;
        } else {
            accept_next(model, seq);
            tokens += seq->unsent;
            over = emit(seq);
            if (over) completed++;
        }
        if (over) {
            *link = seq->next;
            sequence_free(seq);
        } else {
            link = &seq->next;
        }
    }
    while (stops != NULL) {
        StopId* next = stops->next;
        free(stops->id);
        free(stops);
        stops = next;
    }
    inst->steps++;
    inst->tokens += tokens;
    inst->completed += completed;
    inst->cancelled += cancelled_now;
    metric_add(model, METRIC_ACTIVE, (double)arrivals - (double)(completed + cancelled_now));
    metric_add(model, METRIC_TOKENS, (double)tokens);
    metric_add(model, METRIC_COMPLETED, (double)completed);
    metric_add(model, METRIC_CANCELLED, (double)cancelled_now);
}

static void* generation_loop(void* arg) {
    InstanceState* inst = arg;
    uint64_t step_ns = inst->model->step_ns, next_step = monotonic_ns();
    while (1) {
        int idle = 0;
        pthread_mutex_lock(&inst->lock);
        /* Stops wake an idle instance too: a stop for no request in flight is dropped at once, never
         * kept for a later request that happens to reuse the id. */
        while (inst->running && inst->active == NULL && inst->pending == NULL && inst->stops == NULL) {
            idle = 1;
            pthread_cond_wait(&inst->wake, &inst->lock);
        }
        int running = inst->running;
        pthread_mutex_unlock(&inst->lock);
        if (!running) return NULL;
        if (step_ns > 0) {
            /* An idle engine starts its next step when a request arrives, so a first token comes one
             * step after its request (as the CPU reference engine's synthetic mode paces). */
            if (idle) next_step = monotonic_ns() + step_ns;
            if (next_step > monotonic_ns()) sleep_until(next_step);
            uint64_t now = monotonic_ns();
            next_step = next_step + step_ns > now ? next_step + step_ns : now;
        }
        step(inst);
    }
}

/* ---------------------------------------------------------------------------------------- the model */

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
    (void)backend;
    uint32_t major, minor;
    TRITONSERVER_Error* err = TRITONBACKEND_ApiVersion(&major, &minor);
    if (err != NULL) return err;
    if (major != BACKEND_API_MAJOR || minor < BACKEND_API_MINOR)
        return error_new(TRITONSERVER_ERROR_UNSUPPORTED,
                         ENGINE_NAME " is built for backend API %d.%d; this Triton has %u.%u", BACKEND_API_MAJOR,
                         BACKEND_API_MINOR, major, minor);
    return NULL;
}

static TRITONSERVER_Error* model_from_config(ModelState* state, const char* json, size_t size) {
    const char* end = json + size;
    const char* policy = json_get(json, end, "model_transaction_policy");
    const char* decoupled = policy ? json_get(policy, end, "decoupled") : NULL;
    if (decoupled == NULL || strncmp(decoupled, "true", 4) != 0)
        return error_new(TRITONSERVER_ERROR_INVALID_ARG,
                         "%s: the native engine is decoupled only (model_transaction_policy { decoupled: true })",
                         state->name);
    char* text = config_parameter(json, end, "step_ms");
    double step_ms = 20.0;
    if (text != NULL) {
        char* rest;
        step_ms = strtod(text, &rest);
        int bad = rest == text || *rest != '\0' || !(step_ms >= 0.0) || step_ms > 60000.0;
        free(text);
        if (bad)
            return error_new(TRITONSERVER_ERROR_INVALID_ARG,
                             "%s: parameter step_ms must be a number of milliseconds >= 0", state->name);
    }
    state->step_ns = (uint64_t)(step_ms * 1e6);
    text = config_parameter(json, end, "exclude_input_in_output");
    if (text != NULL) {
        int bad = parse_bool(text, &state->exclude_input_default) != 0;
        free(text);
        if (bad)
            return error_new(TRITONSERVER_ERROR_INVALID_ARG,
                             "%s: parameter exclude_input_in_output must be true or false", state->name);
    }
    text = config_parameter(json, end, "token_ids");
    if (text == NULL)
        return error_new(TRITONSERVER_ERROR_INVALID_ARG,
                         "%s: parameter token_ids (the ids the engine emits, as ranges like 3-250,300) is required",
                         state->name);
    int bad = parse_token_ids(text, &state->token_ids, &state->token_count) != 0;
    free(text);
    if (bad)
        return error_new(TRITONSERVER_ERROR_INVALID_ARG,
                         "%s: parameter token_ids must be ascending ranges of ids like 3-250,300", state->name);
    return NULL;
}

/* Everything a model state holds, for a failed ModelInitialize and for ModelFinalize alike. */
static void model_state_free(ModelState* state) {
    metrics_delete(state);
    pthread_mutex_destroy(&state->lock);
    free(state->token_ids);
    free(state);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
    ModelState* state = calloc(1, sizeof *state);
    if (state == NULL) return error_new(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    pthread_mutex_init(&state->lock, NULL);
    const char* name = "";
    TRITONSERVER_Message* message = NULL;
    const char* json;
    size_t size;
    TRITONSERVER_Error* err = TRITONBACKEND_ModelName(model, &name);
    if (err == NULL) {
        snprintf(state->name, sizeof state->name, "%s", name);
        err = TRITONBACKEND_ModelConfig(model, 1, &message);
    }
    if (err == NULL) err = TRITONSERVER_MessageSerializeToJson(message, &json, &size);
    if (err == NULL) err = model_from_config(state, json, size);
    if (message != NULL) IGNORE(TRITONSERVER_MessageDelete(message));
    if (err == NULL) err = metrics_create(state);
    if (err == NULL) err = TRITONBACKEND_ModelSetState(model, state);
    if (err != NULL) {
        model_state_free(state);
        return err;
    }
    LOG_INFO(ENGINE_NAME " model %s: step_ms=%.3f, %zu token ids, exclude_input_in_output=%d", state->name,
             state->step_ns / 1e6, state->token_count, state->exclude_input_default);
    return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
    void* vstate;
    TRITONSERVER_Error* err = TRITONBACKEND_ModelState(model, &vstate);
    if (err != NULL) return err;
    model_state_free(vstate);
    return NULL;
}

/* Takes an instance out of its model's list (stop requests no longer look in it) and stops and joins
   its generation thread if it was started; what it still holds is the caller's to free. */
static void instance_retire(InstanceState* inst) {
    ModelState* state = inst->model;
    pthread_mutex_lock(&state->lock);
    for (size_t i = 0; i < state->instance_count; i++)
        if (state->instances[i] == inst) state->instances[i] = state->instances[--state->instance_count];
    pthread_mutex_unlock(&state->lock);
    if (!inst->thread_started) return;
    pthread_mutex_lock(&inst->lock);
    inst->running = 0;
    pthread_cond_signal(&inst->wake);
    pthread_mutex_unlock(&inst->lock);
    pthread_join(inst->thread, NULL);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
    TRITONBACKEND_Model* model;
    void* vmodel;
    const char* name = "";
    TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceModel(instance, &model);
    if (err == NULL) err = TRITONBACKEND_ModelState(model, &vmodel);
    if (err == NULL) err = TRITONBACKEND_ModelInstanceName(instance, &name);
    if (err != NULL) return err;
    InstanceState* inst = calloc(1, sizeof *inst);
    if (inst == NULL) return error_new(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    inst->model = vmodel;
    snprintf(inst->name, sizeof inst->name, "%s", name);
    pthread_mutex_init(&inst->lock, NULL);
    pthread_cond_init(&inst->wake, NULL);
    inst->running = 1;
    ModelState* state = vmodel;
    pthread_mutex_lock(&state->lock);
    int registered = state->instance_count < MAX_INSTANCES;
    if (registered) state->instances[state->instance_count++] = inst;
    pthread_mutex_unlock(&state->lock);
    if (!registered) err = error_new(TRITONSERVER_ERROR_INVALID_ARG, "at most %d instances", MAX_INSTANCES);
    if (err == NULL && pthread_create(&inst->thread, NULL, generation_loop, inst) != 0)
        err = error_new(TRITONSERVER_ERROR_INTERNAL, "%s: cannot start the generation thread", inst->name);
    if (err == NULL) inst->thread_started = 1;
    if (err == NULL) err = TRITONBACKEND_ModelInstanceSetState(instance, inst);
    if (err != NULL) {
        /* Finalize is not called for an instance that failed to initialize. */
        instance_retire(inst);
        pthread_cond_destroy(&inst->wake);
        pthread_mutex_destroy(&inst->lock);
        free(inst);
    }
    return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
    void* vinst;
    TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceState(instance, &vinst);
    if (err != NULL) return err;
    InstanceState* inst = vinst;
    ModelState* state = inst->model;
    instance_retire(inst);
    /* Requests still in flight end with an error saying why. */
    Sequence* lists[2] = {inst->active, inst->pending};
    uint64_t running = 0;
    for (Sequence* seq = inst->active; seq != NULL; seq = seq->next) running++;
    metric_add(state, METRIC_ACTIVE, -(double)running);
    for (int l = 0; l < 2; l++) {
        for (Sequence* seq = lists[l]; seq != NULL;) {
            Sequence* next = seq->next;
            send_error(seq->factory, error_new(TRITONSERVER_ERROR_UNAVAILABLE, "the engine is shutting down"));
            sequence_free(seq);
            seq = next;
        }
    }
    for (StopId* stop = inst->stops; stop != NULL;) {
        StopId* next = stop->next;
        free(stop->id);
        free(stop);
        stop = next;
    }
    LOG_INFO(ENGINE_NAME " %s: %llu steps, %llu tokens, %llu requests completed, %llu cancelled or stopped",
             inst->name, (unsigned long long)inst->steps, (unsigned long long)inst->tokens,
             (unsigned long long)inst->completed, (unsigned long long)inst->cancelled);
    pthread_cond_destroy(&inst->wake);
    pthread_mutex_destroy(&inst->lock);
    free(inst);
    return NULL;
}

/* `stop`: every instance of the model ends its requests with this id at its next step. */
static TRITONSERVER_Error* stop_request(ModelState* model, TRITONBACKEND_Request* request) {
    const char* id = NULL;
    TRITONSERVER_Error* err = TRITONBACKEND_RequestId(request, &id);
    if (err != NULL) return err;
    if (id == NULL || id[0] == '\0')
        return error_new(TRITONSERVER_ERROR_INVALID_ARG, "a request id is required to stop a request");
    pthread_mutex_lock(&model->lock);
    for (size_t i = 0; i < model->instance_count; i++) {
        InstanceState* inst = model->instances[i];
        StopId* stop = malloc(sizeof *stop);
        char* copy = strdup(id);
        if (stop == NULL || copy == NULL) {
            free(stop);
            free(copy);
            err = error_new(TRITONSERVER_ERROR_INTERNAL, "out of memory");
            break;
        }
        stop->id = copy;
        pthread_mutex_lock(&inst->lock);
        stop->next = inst->stops;
        inst->stops = stop;
        pthread_cond_signal(&inst->wake);
        pthread_mutex_unlock(&inst->lock);
    }
    pthread_mutex_unlock(&model->lock);
    return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                      TRITONBACKEND_Request** requests, const uint32_t request_count) {
    void* vinst;
    TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceState(instance, &vinst);
    if (err != NULL) return err;
    InstanceState* inst = vinst;
    Sequence* accepted = NULL;
    for (uint32_t r = 0; r < request_count; r++) {
        TRITONBACKEND_Request* request = requests[r];
        TRITONBACKEND_ResponseFactory* factory = NULL;
        err = TRITONBACKEND_ResponseFactoryNew(&factory, request);
        if (err != NULL) {
            LOG_ERROR(ENGINE_NAME ": no response factory for a request: %s", TRITONSERVER_ErrorMessage(err));
            TRITONSERVER_ErrorDelete(err);
            IGNORE(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
            continue;
        }
        int64_t stop = 0;
        int given = 0;
        err = read_scalar(request, "stop", TRITONSERVER_TYPE_BOOL, &stop, &given);
        if (err == NULL && stop) {
            err = stop_request(inst->model, request);
            if (err == NULL)
                IGNORE(TRITONBACKEND_ResponseFactorySendFlags(factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
        } else if (err == NULL) {
            Sequence* seq = calloc(1, sizeof *seq);
            if (seq == NULL) {
                err = error_new(TRITONSERVER_ERROR_INTERNAL, "out of memory");
            } else if ((err = parse_request(inst->model, request, seq)) != NULL) {
                sequence_free(seq);
            } else {
                seq->factory = factory;
                factory = NULL;
                seq->next = accepted;
                accepted = seq;
            }
        }
        if (err != NULL) send_error(factory, err);
        if (factory != NULL) IGNORE(TRITONBACKEND_ResponseFactoryDelete(factory));
        /* Everything the engine needs is copied: the request's tensors go back to Triton now. */
        IGNORE(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
    }
    if (accepted != NULL) {
        /* `accepted` is newest first; pending is kept newest first too (reversed when admitted). */
        Sequence* tail = accepted;
        while (tail->next != NULL) tail = tail->next;
        pthread_mutex_lock(&inst->lock);
        tail->next = inst->pending;
        inst->pending = accepted;
        pthread_cond_signal(&inst->wake);
        pthread_mutex_unlock(&inst->lock);
    }
    return NULL;
}
