/* tests/test_layout.c — the layering check (scripts/check_layout.py): the tree passes it, and a small fake tree
 * with a bad include, a model/ subfolder reaching into its peer or up into model/flow, a trainer/ subfolder reaching
 * above it in trainer's order, a file-level cycle and a device twin of a model file fails it, naming file:line
 * (model/flow reaching down into model/dit passes). */
#include <libgen.h>
#include <stdio.h>
#include <string.h>

#include "tests/test.h"


static int have_python3(void) { return test_run(NULL, 0, "python3 -c 'import sys'") == 0; }

TEST(layout_tree_passes) {
    if (!have_python3()) {
        test_skip("python3 not found");
        return;
    }
    /* The objects of the build under test (the folder of VGRPO_BIN) feed the cycle check. */
    char bin[1024], out[16384];
    snprintf(bin, sizeof bin, "%s", test_vgrpo_bin());
    int rc = test_run(out, sizeof out, "python3 scripts/check_layout.py --build '%s'", dirname(bin));
    CHECK_MSG(rc == 0, "check_layout exited %d:\n%s", rc, out);
    CHECK(strstr(out, "0 error(s)") != NULL);
}

TEST(layout_bad_tree_fails) {
    if (!have_python3()) {
        test_skip("python3 not found");
        return;
    }
    const char *d = test_tmpdir();
    char out[16384];
    REQUIRE(test_run(out, sizeof out,
                     "cd '%s' && mkdir -p core trainer/run trainer/step trainer/misc cli model/dit model/vae model/flow "
                     "obj/core",
                     d) == 0);
    test_write_text(d, "cli/app.h", "int app(void);\n");
    test_write_text(d, "trainer/step.c", "/* a trainer file */\n#include \"core/a.h\"\n#include \"cli/app.h\"\nint step;\n");
    test_write_text(d, "model/dit/dit.c", "#include <stdio.h>\n#include \"model/vae/vae.h\"\n#include \"model/dit/x.h\"\n");
    test_write_text(d, "model/vae/vae.h", "int vae(void);\n");
    /* the sub-order inside model/: flow stands above dit (its denoising step calls the DiT), never the reverse */
    test_write_text(d, "model/flow/step.c", "#include \"model/dit/x.h\"\n#include \"model/vae/vae.h\"\n");
    test_write_text(d, "model/dit/up.c", "/* the DiT */\n#include \"model/flow/step.h\"\n");
    /* trainer/step is below trainer/run: run may include step, not the other way round */
    test_write_text(d, "trainer/step/grpo.h", "#include \"trainer/run/run.h\"\n");
    test_write_text(d, "trainer/run/run.h", "#include \"trainer/step/grpo.h\"\n");
    test_write_text(d, "trainer/misc/misc.c", "#include \"trainer/step/grpo.h\"\n"); /* a subfolder not in the order */
    /* the DiT's forward again for the device: a twin (model/vae's lone dev file has none) */
    test_write_text(d, "model/dit/dit_forward.c", "int dit_forward;\n");
    test_write_text(d, "model/dit/dit_dev_forward.c", "int dit_dev_forward;\n");
    test_write_text(d, "model/vae/vae_dev_run.c", "int vae_dev_run;\n");
    /* one of the DiT's former mirrors added back: refused like any other (no twin is known any more) */
    test_write_text(d, "model/dit/wan_backward.c", "int wan_backward;\n");
    test_write_text(d, "model/dit/wan_dev_backward.c", "int wan_dev_backward;\n");
    /* core/a.c and core/b.c call each other: a file-level cycle, found from their objects. */
    test_write_text(d, "core/a.h", "int a(void);\nint b(void);\n");
    test_write_text(d, "core/a.c", "#include \"core/a.h\"\nint a(void) { return b() + 1; }\n");
    test_write_text(d, "core/b.c", "#include \"core/a.h\"\nint b(void) { return 0; }\nint b2(void) { return a(); }\n");
    REQUIRE(test_run(out, sizeof out, "cd '%s' && cc -I. -c core/a.c -o obj/core/a.o && cc -I. -c core/b.c -o obj/core/b.o",
                     d) == 0);
    int rc = test_run(out, sizeof out, "python3 scripts/check_layout.py --root '%s' --build '%s/obj'", d, d);
    CHECK_MSG(rc == 1, "check_layout exited %d:\n%s", rc, out);
    CHECK_MSG(strstr(out, "trainer/step.c:3: folder trainer includes folder cli (trainer must only include folders "
                          "below it: reward, media, model, sp, kernels, core)") != NULL, "%s", out);
    CHECK_MSG(strstr(out, "model/dit/dit.c:2: folder model/dit includes folder model/vae") != NULL, "%s", out);
    CHECK_MSG(strstr(out, "core/a.c:1: file-level cycle in core/: core/a.c -> core/b.c -> core/a.c") != NULL, "%s",
              out);
    CHECK_MSG(strstr(out, "model/dit/dit_dev_forward.c:1: a device twin of model/dit/dit_forward.c") != NULL, "%s",
              out);
    CHECK_MSG(strstr(out, "model/dit/up.c:2: folder model/dit includes folder model/flow") != NULL, "%s", out);
    CHECK(strstr(out, "model/flow/step.c") == NULL); /* flow may include dit and vae */
    CHECK_MSG(strstr(out, "trainer/step/grpo.h:1: folder trainer/step includes folder trainer/run (trainer's "
                          "subfolders include only those below them: run > net, checkpoint, budget > dp > step > "
                          "optim)") != NULL, "%s", out);
    CHECK_MSG(strstr(out, "trainer/misc/misc.c:1: folder trainer/misc is not in trainer's order") != NULL, "%s",
              out);
    CHECK(strstr(out, "trainer/step.c:2") == NULL); /* core is below trainer */
    CHECK(strstr(out, "trainer/run/run.h") == NULL); /* step is below run */
    CHECK(strstr(out, "dit.c:3") == NULL);          /* its own subfolder */
    CHECK_MSG(strstr(out, "model/dit/wan_dev_backward.c:1: a device twin of model/dit/wan_backward.c") != NULL, "%s",
              out);
    CHECK(strstr(out, "KNOWN_TWINS") == NULL);      /* an error, not a known twin's warning */
    CHECK(strstr(out, "vae_dev_run.c") == NULL);    /* no vae_run.c beside it */
    CHECK(strstr(out, "8 error(s)") != NULL);
    /* Without objects the cycle part is skipped with a note; the include errors remain. */
    rc = test_run(out, sizeof out, "python3 scripts/check_layout.py --root '%s' --build '%s/none'", d, d);
    CHECK(rc == 1);
    CHECK_MSG(strstr(out, "note: no object files under") != NULL, "%s", out);
    CHECK(strstr(out, "7 error(s)") != NULL);
}
