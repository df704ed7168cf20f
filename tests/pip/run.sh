#!/bin/bash
# tests/pip/run.sh SOURCE_ROOT - the `pip` meson suite (TAP): `pip install .`
# as a Python user does it, then the engines' call patterns from there.
#  1. builds the wheel from SOURCE_ROOT with meson-python (Debian's
#     python3-mesonpy; pip wheel --no-build-isolation, nothing downloaded;
#     its own build directory, the test suites left out: about a minute);
#  2. checks the wheel holds moonlet, mooncake.store, libmoonlet and the daemons;
#  3. installs it into a fresh virtual environment (with Debian's site
#     packages for pytest only) and runs tests/python/test_engine_patterns.py
#     there: `moonlet` and `mooncake.store` imported from the venv (checked),
#     the cluster's daemons the wheel's own (venv/bin), not the build tree's.
# Reports "1..0 # SKIP <reason>" without python3-mesonpy, patchelf or venv
# (scripts/setup.sh installs them).  Everything lives in a temporary
# directory, removed at the end.
set -u
S=$(readlink -f "$1")
PY=/usr/bin/python3
skip() { echo "1..0 # SKIP $*"; exit 0; }
$PY -c 'import mesonpy' 2>/dev/null || skip "python3-mesonpy missing (run scripts/setup.sh)"
command -v patchelf >/dev/null || skip "patchelf missing (run scripts/setup.sh)"
$PY -c 'import ensurepip, venv' 2>/dev/null || skip "python3-venv missing (run scripts/setup.sh)"

T=$(mktemp -d "${TMPDIR:-/tmp}/moonlet-pip.XXXXXX")
trap 'rm -rf "$T"' EXIT
echo "1..3"
log() { sed 's/^/# /' "$1"; }

if (cd "$S" && timeout 1200 $PY -m pip wheel --no-build-isolation --no-deps --no-index \
        -w "$T/wheel" .) > "$T/build.log" 2>&1; then
    echo "ok 1 - pip wheel . (meson-python)"
else
    log "$T/build.log"; echo "not ok 1 - pip wheel ."; exit 1
fi
WHL=$(ls "$T"/wheel/moonlet-*.whl)
$PY - "$WHL" > "$T/contents.log" 2>&1 <<'PYEOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
want = ["moonlet/__init__.py", "moonlet/mooncake.py", "mooncake/store.py", "libmoonlet.so",
        "moonlet/_moonlet.cpython", "scripts/moonlet-master", "scripts/moonlet-store",
        "scripts/moonlet-inspect", "headers/moonlet/client.h"]
missing = [w for w in want if not any(w in n for n in names)]
print("\n".join(names))
sys.exit(f"missing from the wheel: {missing}" if missing else 0)
PYEOF
if [ $? -eq 0 ]; then echo "ok 2 - the wheel holds moonlet, mooncake.store, libmoonlet, the daemons"
else log "$T/contents.log"; echo "not ok 2 - wheel contents"; exit 1; fi

V=$T/venv
{
    $PY -m venv --system-site-packages "$V" &&
    "$V/bin/python" -m pip install --no-index --no-deps "$WHL" &&
    # the package and the daemons are the venv's, not the source or build tree's
    (cd "$T" && "$V/bin/python" -c '
import sys, moonlet, mooncake.store
for m in (moonlet, mooncake.store):
    assert m.__file__.startswith(sys.prefix), m.__file__
print("moonlet from", moonlet.__file__)') &&
    mkdir -p "$T/root" && ln -s "$V/bin" "$T/root/tools" &&
    (cd "$T" && MOONLET_BUILD_ROOT=$T/root PYTHONDONTWRITEBYTECODE=1 PYTHONPATH= \
        timeout 600 "$V/bin/python" -m pytest -q -p no:cacheprovider \
        -k "not engine_client_example" "$S/tests/python/test_engine_patterns.py")
} > "$T/venv.log" 2>&1
if [ $? -eq 0 ]; then
    grep -E "passed|moonlet from" "$T/venv.log" | sed 's/^/# /'
    echo "ok 3 - engine patterns from a fresh venv with the wheel installed"
else
    log "$T/venv.log"; echo "not ok 3 - engine patterns from the venv"; exit 1
fi
