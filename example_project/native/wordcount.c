#include "native/wordcount.h"

void wc_count(const char *buf, size_t len, struct wc_counts *out)
{
    int in_word = 0;
    out->bytes = len;
    out->words = 0;
    out->lines = 0;
    for (size_t i = 0; i < len; i++) {
        char ch = buf[i];
        int space = ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
        if (ch == '\n')
            out->lines++;
        if (!space && !in_word)
            out->words++;
        in_word = !space;
    }
}
