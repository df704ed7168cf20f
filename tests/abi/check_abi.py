#!/usr/bin/env python3
"""The ABI of libmoonlet.so, checked on the built library and on a copy
installed with `meson install --destdir` (issue 18):

  exports    every symbol the library exports (nm -D --defined-only) is a
             moonlet_ function that an installed header declares with
             MOONLET_API, every such declaration is exported, and the
             soname carries a version (libmoonlet.so.N).
  pkgconfig  [CC [FLAGS...]]: a program that includes only the installed headers
             (abi_program.c) compiles and links with
             `pkg-config --cflags --libs moonlet` against the installed
             moonlet.pc, and runs against the installed library.

Run by meson test (suite abi) with MOONLET_BUILD_ROOT and
MOONLET_SOURCE_ROOT set; exits non-zero with the reason on any mismatch.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

BUILD = os.environ["MOONLET_BUILD_ROOT"]
SOURCE = os.environ["MOONLET_SOURCE_ROOT"]
DECL = re.compile(r"MOONLET_API\s+[^;{}()]*?\b(moonlet_\w+)\s*\(")


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def install(dest):
    subprocess.run(["meson", "install", "-C", BUILD, "--destdir", dest, "--no-rebuild",
                    "--quiet"], check=True, stdout=subprocess.DEVNULL)


def one(pattern, what, isdir=False):
    hits = sorted(h for h in glob.glob(pattern, recursive=True)
                  if (os.path.isdir(h) if isdir else os.path.isfile(h)))
    if len(hits) != 1:
        fail("expected one %s (%s), found %r" % (what, pattern, hits))
    return hits[0]


def declared(incdir):
    names = set()
    for h in glob.glob(os.path.join(incdir, "*.h")):
        with open(h) as f:
            names |= set(DECL.findall(f.read()))
    if not names:
        fail("no MOONLET_API declaration under " + incdir)
    return names


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            syms[parts[2].split("@")[0]] = parts[1]
    return syms


def check_exports(lib, incdir):
    api = declared(incdir)
    syms = exported(lib)
    bad = sorted(s for s in syms if not s.startswith("moonlet_"))
    if bad:
        fail("%s exports %d symbols without the moonlet_ prefix: %s" %
             (lib, len(bad), " ".join(bad[:40])))
    undeclared = sorted(s for s in syms if s not in api)
    if undeclared:
        fail("%s exports symbols no installed header declares with MOONLET_API: %s" %
             (lib, " ".join(undeclared)))
    notfunc = sorted(s for s, t in syms.items() if t not in ("T", "W", "i"))
    if notfunc:
        fail("%s exports non-function symbols: %s" % (lib, " ".join(notfunc)))
    missing = sorted(api - set(syms))
    if missing:
        fail("%s lacks declared functions: %s" % (lib, " ".join(missing)))
    dyn = subprocess.run(["objdump", "-p", lib], check=True, capture_output=True,
                         text=True).stdout
    m = re.search(r"SONAME\s+(\S+)", dyn)
    if not m or not re.fullmatch(r"libmoonlet\.so\.\d+", m.group(1)):
        fail("%s: soname %r is not libmoonlet.so.N" % (lib, m.group(1) if m else None))
    print("%s: %d exported functions, all declared in %s; soname %s" %
          (lib, len(syms), incdir, m.group(1)))


def main():
    mode = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="moonlet-abi-") as dest:
        install(dest)
        lib = one(os.path.join(dest, "**", "libmoonlet.so.*.*.*"), "installed libmoonlet.so")
        incdir = one(os.path.join(dest, "**", "include", "moonlet"), "installed include/moonlet", isdir=True)
        if mode == "exports":
            check_exports(one(os.path.join(BUILD, "libmoonlet.so.*.*.*"), "built libmoonlet.so"),
                          os.path.join(SOURCE, "include", "moonlet"))
            check_exports(lib, incdir)
            return
        pcdir = os.path.dirname(one(os.path.join(dest, "**", "pkgconfig", "moonlet.pc"),
                                    "installed moonlet.pc"))
        env = dict(os.environ, PKG_CONFIG_PATH=pcdir, PKG_CONFIG_SYSROOT_DIR=dest,
                   PKG_CONFIG_LIBDIR=pcdir)
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "moonlet"], env=env,
                               check=True, capture_output=True, text=True).stdout.split()
        for f in flags:
            if f.startswith(("-I", "-L")) and not f[2:].startswith(dest):
                fail("pkg-config points outside the install: " + f)
        exe = os.path.join(dest, "abi_program")
        cc = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("CC", "cc")
        extra = sys.argv[3:]  # the build's sanitizer flags, if any
        subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-o", exe] + extra +
                       [os.path.join(SOURCE, "tests", "abi", "abi_program.c")] + flags,
                       check=True)
        run_env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(lib))
        out = subprocess.run([exe], env=run_env, capture_output=True, text=True, timeout=60)
        sys.stdout.write(out.stdout)
        sys.stderr.write(out.stderr)
        if out.returncode != 0:
            fail("abi_program exited %d" % out.returncode)
        ldd = subprocess.run(["ldd", exe], env=run_env, capture_output=True, text=True).stdout
        if dest not in ldd:
            fail("abi_program did not load the installed libmoonlet.so:\n" + ldd)


if __name__ == "__main__":
    main()
