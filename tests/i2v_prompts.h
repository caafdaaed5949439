/* tests/i2v_prompts.h — the image-to-video run tests' prompt file: dir/img/<name>.png for red, green, blue and yellow
 * (32 x 32: the colour with a 16 x 16 square of its complement in the middle) and dir/p.jsonl naming them, one JSON
 * line each {"prompt": "a <name> square", "image": "img/<name>.png"} (with color_field also "color": "<name>"). */
#ifndef TESTS_I2V_PROMPTS_H
#define TESTS_I2V_PROMPTS_H

#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include "media/png.h"
#include "tests/test.h"

static inline void i2v_write_square_prompts(const char *dir, int color_field) {
    static const struct {
        const char *name;
        uint8_t c[3];
    } cols[4] = {{"red", {220, 30, 30}}, {"green", {30, 200, 40}}, {"blue", {30, 40, 220}}, {"yellow", {230, 220, 30}}};
    char path[4300];
    snprintf(path, sizeof path, "%s/img", dir);
    mkdir(path, 0777);
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    uint8_t img[32 * 32 * 3];
    for (int k = 0; k < 4; k++) {
        for (int y = 0; y < 32; y++)
            for (int x = 0; x < 32; x++)
                for (int c = 0; c < 3; c++) {
                    const int in = x >= 8 && x < 24 && y >= 8 && y < 24;
                    img[(y * 32 + x) * 3 + c] = in ? (uint8_t)(255 - cols[k].c[c]) : cols[k].c[c];
                }
        snprintf(path, sizeof path, "%s/img/%s.png", dir, cols[k].name);
        REQUIRE_OK(media_png_write(path, img, 32, 32));
        if (color_field)
            fprintf(f, "{\"prompt\": \"a %s square\", \"image\": \"img/%s.png\", \"color\": \"%s\"}\n", cols[k].name,
                    cols[k].name, cols[k].name);
        else
            fprintf(f, "{\"prompt\": \"a %s square\", \"image\": \"img/%s.png\"}\n", cols[k].name, cols[k].name);
    }
    fclose(f);
}

#endif
