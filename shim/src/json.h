/* json.h: the protocol's JSON: a growable writer whose strings are always valid JSON, and a strict
 * reader of one flat object. Layer 0: depends on nothing else of the shim. */
#ifndef GS_JSON_H
#define GS_JSON_H

#include <stddef.h>

struct gs_buf {
    char *p;
    size_t n, cap;
    int oom; /* an allocation failed: the text is incomplete and must not be sent */
};
void gs_buf_printf(struct gs_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A JSON string literal of any bytes: quotes, backslashes and control characters escaped, each
 * byte that is not part of valid UTF-8 replaced by U+FFFD. */
void gs_buf_str(struct gs_buf *b, const char *s);
void gs_buf_free(struct gs_buf *b);
/* Bytes as a JSON string of lowercase hex digits; and back (exactly 2n digits): 0, or -1. */
void gs_buf_hex(struct gs_buf *b, const unsigned char *p, size_t n);
int gs_hex_decode(const char *hex, unsigned char *out, size_t n);

#define GS_JSON_MAX_FIELDS 16
struct gs_json_field {
    char key[32];
    int type; /* 's' string, 'i' integer, 'b' boolean, 'n' null */
    char str[256];
    long long num;
};
struct gs_json {
    int n;
    struct gs_json_field f[GS_JSON_MAX_FIELDS];
};
/* Parses one flat JSON object (string keys; string, integer, boolean or null values). Returns 0,
 * or -1 with a reason in err. */
int gs_json_parse(const char *text, size_t len, struct gs_json *out, char *err, size_t errlen);
/* The field named key if it has that type, else NULL. */
const struct gs_json_field *gs_json_get(const struct gs_json *j, const char *key, int type);
/* Whether the object has a field named key (of any type). */
int gs_json_has(const struct gs_json *j, const char *key);

#endif
