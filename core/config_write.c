/* core/config_write.c — writing YAML back out (see config.h): strings as plain or double-quoted scalars that load
 * back to the same bytes, and trees as one line of flow text. Used by config.resolved.yaml (config_schema.c's dump)
 * and by --set values written into messages. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/config.h"
#include "core/config_internal.h"
#include "core/error.h"

/* The code point of the UTF-8 sequence at s (its length in *len), or -1 (with *len 1) for a byte that starts no
 * valid sequence. Strings of a loaded tree are always valid; this guards the writer, not the reader. */
static int32_t utf8_at(const unsigned char *s, int *len) {
    int n = *s < 0x80 ? 1 : (*s & 0xe0) == 0xc0 ? 2 : (*s & 0xf0) == 0xe0 ? 3 : (*s & 0xf8) == 0xf0 ? 4 : 0;
    *len = 1;
    if (!n) return -1;
    uint32_t c = n == 1 ? *s : *s & (0x7f >> n);
    for (int k = 1; k < n; k++) {
        if ((s[k] & 0xc0) != 0x80) return -1;
        c = (c << 6) | (s[k] & 0x3f);
    }
    static const uint32_t min_for_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min_for_len[n] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return -1;
    *len = n;
    return (int32_t)c;
}

/* 1 if code point c must be written as an escape inside double quotes: a character YAML does not allow raw in a
 * document (the C0 and C1 controls, DEL, U+FEFF, U+FFFE, U+FFFF), or one YAML reads as a line break (NEL U+0085,
 * LS U+2028, PS U+2029: raw, they would end the line, and a quoted string folds them into a space). */
static int must_escape(int32_t c) {
    return c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f) || c == 0x2028 || c == 0x2029 || c == 0xfeff ||
           c == 0xfffe || c == 0xffff;
}

/* 1 if s, written plain (also inside [ ] and { }), reads back as the string s. Conservative. */
static int plain_safe(const char *s) {
    static const char *const yaml11_words[] = {"y", "n", "yes", "no", "on", "off"};
    int64_t i;
    double d;
    bool b;
    if (!*s || s[strlen(s) - 1] == ' ') return 0;
    if (strchr("-?:,[]{}#&*!|>'\"%@` .+0123456789", s[0])) return 0;
    if (!strcmp(s, "~") || !strcasecmp(s, "null") || core_cfgi_text_bool(s, &b) || core_cfgi_text_int(s, &i) ||
        core_cfgi_text_double(s, &d))
        return 0;
    for (size_t k = 0; k < sizeof yaml11_words / sizeof yaml11_words[0]; k++)
        if (!strcasecmp(s, yaml11_words[k])) return 0;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int len;
        const int32_t c = utf8_at(p, &len);
        if (c < 0 || must_escape(c) || (c < 0x80 && strchr(",[]{}:#\\", c))) return 0;
        p += len;
    }
    return 1;
}

void core_config_write_string(const char *s, FILE *f) {
    if (plain_safe(s)) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int len;
        const int32_t c = utf8_at(p, &len);
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\t': fputs("\\t", f); break;
        case '\r': fputs("\\r", f); break;
        case 0x85: fputs("\\N", f); break;
        case 0x2028: fputs("\\L", f); break;
        case 0x2029: fputs("\\P", f); break;
        default:
            if (c < 0) /* not UTF-8 (never from a loaded tree): written as the code point of the byte, never raw */
                fprintf(f, "\\x%02x", *p);
            else if (must_escape(c))
                fprintf(f, c < 0x100 ? "\\x%02x" : "\\u%04x", (unsigned)c);
            else
                fwrite(p, 1, (size_t)len, f);
        }
        p += len;
    }
    fputc('"', f);
}

static void write_flow(const core_cfg_node *n, FILE *f) {
    if (n->kind == CORE_NODE_SCALAR) {
        if (core_config_is_null(n))
            fputs("null", f);
        else if (n->quoted)
            core_config_write_string(n->text, f);
        else {
            /* A plain number or boolean keeps its form (so it stays one); any other plain scalar is a string and
             * is written as one, quoted when plain text would not read back the same. */
            int64_t iv;
            double dv;
            bool bv;
            if (core_cfgi_text_int(n->text, &iv) || core_cfgi_text_double(n->text, &dv) ||
                core_cfgi_text_bool(n->text, &bv))
                fputs(n->text, f);
            else
                core_config_write_string(n->text, f);
        }
        return;
    }
    fputc(n->kind == CORE_NODE_MAP ? '{' : '[', f);
    for (int i = 0; i < n->n; i++) {
        if (i) fputs(", ", f);
        if (n->kind == CORE_NODE_MAP) {
            core_config_write_string(n->keys[i], f);
            fputs(": ", f);
        }
        write_flow(n->items[i], f);
    }
    fputc(n->kind == CORE_NODE_MAP ? '}' : ']', f);
}

int core_config_write_flow(const core_cfg_node *node, FILE *f) {
    write_flow(node, f);
    return ferror(f) ? core_error("config: write failed") : 0;
}
