#!/usr/bin/env bash
# Lay out Transformers' own common model tests (ModelTesterMixin, from the release's sdist) with this
# project's tiny testers for twelve architectures, ready to run on "cpu" and on "tpu":
#
#   pip download transformers==$(python -c "import transformers; print(transformers.__version__)") \
#       --no-binary :all: --no-deps -d /tmp/tf_sdist
#   bash tools/transformers_suite/setup.sh /tmp/tf_sdist/transformers-*.tar.gz /tmp/tfsuite
#   python tools/transformers_tests.py run /tmp/tfsuite tests/models/zoo --out /tmp/tfsuite_runs --markdown
#
# (tools/transformers_tests.py runs each file on "cpu" and on "tpu" and compares them by test id; it runs a
# real Transformers checkout the same way.)
#
# The sdist ships tests/test_*_common.py but not tests/models/ nor tests/generation/: the generation
# and export mixins are stubbed out (their tests are not run), the model testers are ours.
set -euo pipefail
sdist=$1
dest=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dest"
tar xzf "$sdist" -C "$dest" --strip-components=1 --wildcards '*/tests/*'
cd "$dest/tests"
mkdir -p utils generation exporters models/zoo
touch __init__.py utils/__init__.py generation/__init__.py exporters/__init__.py models/__init__.py models/zoo/__init__.py
[ -f utils/test_configuration_utils.py ] || echo "config_common_kwargs = {}" > utils/test_configuration_utils.py
printf 'class GenerationTesterMixin:\n    pass\n' > generation/test_utils.py
printf 'class ExportTesterMixin:\n    pass\n' > exporters/test_export.py
cp "$here/test_zoo_common.py" models/zoo/
cd "$dest"
python -m torchtpu.integrations.transformers_device_spec tpu_spec.py
echo "ready: $dest"
