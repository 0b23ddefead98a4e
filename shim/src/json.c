/* json.c: just enough JSON for the control protocol: a growable writer, and a strict reader of one
 * flat object (requests carry a command and a few scalar fields). The reader never trusts the
 * input: every length is bounded and anything unexpected is an error with a reason. The writer's
 * strings are valid JSON whatever bytes they quote (replies quote request bytes). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static void reserve(struct gs_buf *b, size_t extra)
{
    if (b->oom || b->n + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

void gs_buf_printf(struct gs_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[512];
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    reserve(b, (size_t)n);
    if (b->oom)
        return;
    if ((size_t)n < sizeof(small)) {
        memcpy(b->p + b->n, small, (size_t)n + 1);
    } else {
        va_start(ap, fmt);
        vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->n += (size_t)n;
}

static void put(struct gs_buf *b, const char *p, size_t n)
{
    reserve(b, n);
    if (b->oom)
        return;
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlongs, surrogates or code points
 * above U+10FFFF), or 0. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned char c = s[0];
    unsigned char lo = 0x80, hi = 0xbf;
    size_t n;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        lo = c == 0xe0 ? 0xa0 : 0x80; /* no overlong form */
        hi = c == 0xed ? 0x9f : 0xbf; /* no surrogate */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        lo = c == 0xf0 ? 0x90 : 0x80;
        hi = c == 0xf4 ? 0x8f : 0xbf; /* nothing above U+10FFFF */
    } else {
        return 0;
    }
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return n;
}

void gs_buf_str(struct gs_buf *b, const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    put(b, "\"", 1);
    while (*s) {
        size_t run = 0; /* plain ASCII goes out in one piece */
        while (s[run] >= 0x20 && s[run] < 0x7f && s[run] != '"' && s[run] != '\\')
            run++;
        put(b, (const char *)s, run);
        s += run;
        if (!*s)
            break;
        if (*s == '"' || *s == '\\') {
            char esc[2] = {'\\', (char)*s++};
            put(b, esc, 2);
        } else if (*s < 0x80) { /* control characters and DEL */
            gs_buf_printf(b, "\\u%04x", *s++);
        } else {
            size_t n = utf8_len(s);
            if (n) {
                put(b, (const char *)s, n);
                s += n;
            } else {
                put(b, "\xef\xbf\xbd", 3); /* U+FFFD for a byte that is not UTF-8 */
                s++;
            }
        }
    }
    put(b, "\"", 1);
}

void gs_buf_hex(struct gs_buf *b, const unsigned char *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        char two[2] = {digits[p[i] >> 4], digits[p[i] & 15]};
        put(b, two, 2);
    }
    put(b, "\"", 1);
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int gs_hex_decode(const char *hex, unsigned char *out, size_t n)
{
    if (strlen(hex) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

void gs_buf_free(struct gs_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* ---- reader ----------------------------------------------------------------------------------- */

struct rd {
    const char *start, *p, *end;
    char *err;
    size_t errlen;
};

static int fail(struct rd *r, const char *why)
{
    snprintf(r->err, r->errlen, "bad JSON at byte %ld: %s", (long)(r->p - r->start), why);
    return -1;
}

static void ws(struct rd *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

/* A string into out (at most outlen-1 bytes; longer is an error). \uXXXX above 0x7f is refused:
 * no protocol field needs it. */
static int str(struct rd *r, char *out, size_t outlen)
{
    if (r->p >= r->end || *r->p != '"')
        return fail(r, "expected a string");
    r->p++;
    size_t n = 0;
    while (r->p < r->end && *r->p != '"') {
        char c = *r->p++;
        if ((unsigned char)c < 0x20)
            return fail(r, "control character in string");
        if (c == '\\') {
            if (r->p >= r->end)
                return fail(r, "truncated escape");
            char e = *r->p++;
            switch (e) {
            case '"': case '\\': case '/': c = e; break;
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                if (r->end - r->p < 4)
                    return fail(r, "truncated \\u escape");
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    char h = *r->p++;
                    v <<= 4;
                    if (h >= '0' && h <= '9') v |= (unsigned)(h - '0');
                    else if (h >= 'a' && h <= 'f') v |= (unsigned)(h - 'a' + 10);
                    else if (h >= 'A' && h <= 'F') v |= (unsigned)(h - 'A' + 10);
                    else return fail(r, "bad \\u escape");
                }
                if (v == 0 || v > 0x7f)
                    return fail(r, "\\u escape outside ASCII");
                c = (char)v;
                break;
            }
            default: return fail(r, "unknown escape");
            }
        }
        if (n + 1 >= outlen)
            return fail(r, "string too long");
        out[n++] = c;
    }
    if (r->p >= r->end)
        return fail(r, "unterminated string");
    r->p++;
    out[n] = 0;
    return 0;
}

int gs_json_parse(const char *text, size_t len, struct gs_json *out, char *err, size_t errlen)
{
    struct rd r = {text, text, text + len, err, errlen};
    memset(out, 0, sizeof(*out));
    /* A trailing NUL (C senders) is allowed. */
    while (r.end > r.p && r.end[-1] == 0)
        r.end--;
    ws(&r);
    if (r.p >= r.end || *r.p != '{')
        return fail(&r, "expected an object");
    r.p++;
    ws(&r);
    if (r.p < r.end && *r.p == '}') {
        r.p++;
        goto done;
    }
    for (;;) {
        if (out->n == GS_JSON_MAX_FIELDS)
            return fail(&r, "too many fields");
        struct gs_json_field *f = &out->f[out->n];
        ws(&r);
        if (str(&r, f->key, sizeof(f->key)))
            return -1;
        for (int i = 0; i < out->n; i++)
            if (!strcmp(out->f[i].key, f->key))
                return fail(&r, "duplicate key");
        ws(&r);
        if (r.p >= r.end || *r.p != ':')
            return fail(&r, "expected ':'");
        r.p++;
        ws(&r);
        if (r.p >= r.end)
            return fail(&r, "truncated value");
        if (*r.p == '"') {
            f->type = 's';
            if (str(&r, f->str, sizeof(f->str)))
                return -1;
        } else if (*r.p == '-' || (*r.p >= '0' && *r.p <= '9')) {
            int neg = *r.p == '-';
            if (neg)
                r.p++;
            unsigned long long v = 0;
            int digits = 0;
            while (r.p < r.end && *r.p >= '0' && *r.p <= '9') {
                if (++digits > 19)
                    return fail(&r, "number too large");
                v = v * 10 + (unsigned long long)(*r.p++ - '0');
            }
            if (!digits)
                return fail(&r, "bad number");
            if (v > (unsigned long long)__LONG_LONG_MAX__)
                return fail(&r, "number too large");
            if (r.p < r.end && (*r.p == '.' || *r.p == 'e' || *r.p == 'E'))
                return fail(&r, "only integers are accepted");
            f->type = 'i';
            f->num = neg ? -(long long)v : (long long)v;
        } else if (r.end - r.p >= 4 && !memcmp(r.p, "true", 4)) {
            f->type = 'b';
            f->num = 1;
            r.p += 4;
        } else if (r.end - r.p >= 5 && !memcmp(r.p, "false", 5)) {
            f->type = 'b';
            r.p += 5;
        } else if (r.end - r.p >= 4 && !memcmp(r.p, "null", 4)) {
            f->type = 'n';
            r.p += 4;
        } else {
            return fail(&r, "unsupported value (nested objects and arrays are not accepted)");
        }
        out->n++;
        ws(&r);
        if (r.p < r.end && *r.p == ',') {
            r.p++;
            continue;
        }
        if (r.p < r.end && *r.p == '}') {
            r.p++;
            break;
        }
        return fail(&r, "expected ',' or '}'");
    }
done:
    ws(&r);
    if (r.p != r.end)
        return fail(&r, "trailing bytes after the object");
    return 0;
}

const struct gs_json_field *gs_json_get(const struct gs_json *j, const char *key, int type)
{
    for (int i = 0; i < j->n; i++)
        if (!strcmp(j->f[i].key, key))
            return j->f[i].type == type ? &j->f[i] : NULL;
    return NULL;
}

int gs_json_has(const struct gs_json *j, const char *key)
{
    for (int i = 0; i < j->n; i++)
        if (!strcmp(j->f[i].key, key))
            return 1;
    return 0;
}
