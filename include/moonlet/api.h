/*
 * moonlet/api.h - MOONLET_API, the mark of a function libmoonlet.so exports.
 *
 * The library is built with hidden visibility by default (meson's
 * gnu_symbol_visibility), so a function is part of the ABI only when its
 * declaration in an installed header carries MOONLET_API.  Everything else
 * (the master, the store node, the transport, test hooks) stays inside the
 * library and the internal static libraries the daemons and tests link;
 * tests/abi checks that the exported set is exactly the marked one.
 */
#ifndef MOONLET_API_H
#define MOONLET_API_H

#if defined(__GNUC__) || defined(__clang__)
#define MOONLET_API __attribute__((visibility("default")))
#else
#define MOONLET_API
#endif

#endif
