/* Unit test of the wordcount library. */
#include <stdio.h>
#include <string.h>

#include "native/format.h"

static int check(const char *text, size_t words, size_t lines)
{
    struct wc_counts c;
    wc_count(text, strlen(text), &c);
    if (c.words != words || c.lines != lines || c.bytes != strlen(text)) {
        fprintf(stderr, "%s: got %zu words %zu lines, want %zu %zu\n", text, c.words, c.lines, words, lines);
        return 1;
    }
    return 0;
}

int main(void)
{
    char line[WC_FORMAT_MAX];
    struct wc_counts c = {3, 2, 1};
    int bad = check("", 0, 0) + check("one", 1, 0) + check(" two  words\n", 2, 1) + check("a\nb\nc\n", 3, 3);
    wc_format(&c, line, sizeof line);
    if (strcmp(line, "1 lines, 2 words, 3 bytes") != 0) {
        fprintf(stderr, "format: got %s\n", line);
        bad++;
    }
    return bad != 0;
}
