"""Option wording every command shares, so one idea has one name, one short option and one help text.

Conventions (README, docs/cli.md): -o out, -i images, -m model (where the model is an option), -t target,
-b batch size, --json FILE|- (strict JSON to FILE, '-' for stdout alone). Old names stay as hidden aliases.
"""

from __future__ import annotations

TARGET_NAMES = ("trt8.5, trt8.6, trt10, trt11 (or a version: trt10.3), ort (a CPU), or the device: a JetPack "
                "(jetpack5.1 … jetpack7.2, 'JetPack 6.1', jp6.1) and/or a Jetson module (agx-orin, orin-nx, "
                "orin-nano, agx-xavier, xavier-nx, thor), e.g. jetpack6.1-orin-nano")
JSON_HELP = "Write the results as JSON to FILE ('-': stdout alone, without the table)."
IMAGES_ALIAS_HELP = "Old name of --images."
