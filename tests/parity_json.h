/* tests/parity_json.h — the end-to-end tests' check of a `vgrpo parity` report (parity.json): it passed, max |dlogp|
 * and max |dv| are numbers and exactly 0, and it covers want_steps denoising steps. */
#ifndef TESTS_PARITY_JSON_H
#define TESTS_PARITY_JSON_H

#include <jansson.h>

#include "tests/test.h"

static inline void check_parity_zero(const char *path, int want_steps) {
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) test_fail(__FILE__, __LINE__, "%s: %s", path, e.text);
    REQUIRE(j);
    CHECK(json_is_true(json_object_get(j, "pass")));
    const json_t *dlogp = json_object_get(j, "max_abs_dlogp"), *dv = json_object_get(j, "max_abs_dv");
    CHECK_MSG(json_is_number(dlogp) && json_number_value(dlogp) == 0.0, "%s: max_abs_dlogp %g", path,
              json_number_value(dlogp));
    CHECK_MSG(json_is_number(dv) && json_number_value(dv) == 0.0, "%s: max_abs_dv %g", path, json_number_value(dv));
    CHECK((int)json_array_size(json_object_get(j, "steps")) == want_steps);
    json_decref(j);
}

#endif
