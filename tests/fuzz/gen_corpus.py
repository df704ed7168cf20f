#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_frame into corpus_frame/ (run once; the
binary files are committed).  A tiny hand-rolled msgpack encoder keeps it
dependency-free.  Each seed is a whole frame: 4-byte big-endian length +
body.  Replies pack the code as int32 (0xd2), like moonlet_reply_begin."""
import os
import struct

class I32(int):
    """An int packed in the fixed int32 form."""

def pack(o):
    if o is None:
        return b"\xc0"
    if o is True:
        return b"\xc3"
    if o is False:
        return b"\xc2"
    if isinstance(o, I32):
        return b"\xd2" + struct.pack(">i", o)
    if isinstance(o, int):
        if 0 <= o < 0x80:
            return bytes([o])
        if -32 <= o < 0:
            return struct.pack(">b", o)
        if 0 <= o < 1 << 8:
            return b"\xcc" + struct.pack(">B", o)
        if 0 <= o < 1 << 16:
            return b"\xcd" + struct.pack(">H", o)
        if 0 <= o < 1 << 32:
            return b"\xce" + struct.pack(">I", o)
        if 0 <= o < 1 << 64:
            return b"\xcf" + struct.pack(">Q", o)
        return b"\xd3" + struct.pack(">q", o)
    if isinstance(o, float):
        return b"\xcb" + struct.pack(">d", o)
    if isinstance(o, bytes):
        return b"\xc4" + bytes([len(o)]) + o
    if isinstance(o, str):
        b = o.encode()
        if len(b) < 32:
            return bytes([0xa0 | len(b)]) + b
        return b"\xd9" + bytes([len(b)]) + b
    if isinstance(o, list):
        head = bytes([0x90 | len(o)]) if len(o) < 16 else b"\xdc" + struct.pack(">H", len(o))
        return head + b"".join(pack(x) for x in o)
    if isinstance(o, dict):
        head = bytes([0x80 | len(o)])
        return head + b"".join(pack(k) + pack(v) for k, v in o.items())
    raise TypeError(o)

def frame(body):
    return struct.pack(">I", len(body)) + body

replica = ["seg-1", "127.0.0.1:7000", "tcp", 0x7F0000000000, 4096, 1 << 20, 2]
seeds = {
    "req_echo": pack([1, 2, []]),
    "req_auth": pack([1, 1, ["s3cret"]]),
    "req_exist_key": pack([2, 10, ["tenant", "model/layer-0/block-1"]]),
    "req_batch_exist_key": pack([3, 11, ["", ["k%d" % i for i in range(20)]]]),
    "req_put_start": pack([4, 6, ["t", "k", 1 << 20, 2, True]]),
    "req_mount_segment": pack([5, 4, ["client-1", "seg-1", "dram0", 0x7F0000000000,
                                      1 << 30, "127.0.0.1:7000", "tcp"]]),
    "req_list_keys": pack([6, 17, ["t", "model/", "", 100]]),
    "req_mixed_types": pack([7, 2, [1.5, b"\x00\x01bin", -1, (1 << 63), None, False,
                                    {"a": [1, {"b": None}]}]]),
    # trailing optional arguments and groups of the method table (master/service/methods.c)
    "req_mount_segment_key_alt": pack([11, 4, ["client-1", "seg-1", "dram0", 0x7F0000000000,
                                               1 << 30, "127.0.0.1:7000", "rdma",
                                               b"0123456789abcdef", 123456, "127.0.0.1:7001",
                                               "seg-1-tcp", "tcp"]]),
    "req_mount_segment_key_no_clock": pack([12, 4, ["c", "s", "n", 0, 4096, "h:1", "tcp",
                                                    b"0123456789abcdef"]]),
    "req_put_start_opts": pack([13, 6, ["t", "k", 1 << 20, 2, True, ["node-a", "h:7000"],
                                        True, 5000]]),
    "req_probe_resume": pack([14, 21, ["t", ["kv0", "kv1", "kv2"], 2, ["d0", "d1"], [1, 3]]]),
    "req_batch_probe_key": pack([15, 13, ["t", 1, 2, ["a", "b"]]]),
    "req_remove_force": pack([16, 14, ["t", "k", True]]),
    "req_put_replace_replica": pack([19, 22, ["t", "k", "seg-1", ["seg-1", "seg-2"]]]),
    # the batch methods (34-37): keys with sizes, ids and checksums per key
    "req_batch_put_start": pack([20, 34, ["t", ["k0", "k1", "k2"], [4096, 1 << 20, 0], 1, False,
                                          ["node-a"], True, 5000]]),
    "req_batch_put_end": pack([21, 35, ["t", ["k0", "k1"], [0x1234, 1 << 63], [7, 8]]]),
    "req_batch_put_revoke": pack([22, 36, ["t", ["k0"], [7]]]),
    "req_batch_get_replica_list": pack([23, 37, ["t", ["k%d" % i for i in range(8)]]]),
    "rep_batch_put_start": pack([24, I32(0), [[7, [replica]], -704, [8, [replica, replica]]]]),
    # the DummyClient protocol (store/client/dummy_proto.c): nil tenant, tuple items
    "req_dm_batch_put": pack([17, 113, [None, 1, False, [["k0", 1, 0, 10], ["k1", 2, 64, 5]],
                                        False, ["node-a"], True, 0]]),
    "req_dm_put": pack([18, 103, ["t", "k", 1, 0, 4096, 2, True, True]]),
    "rep_ok_nil": pack([1, I32(0), None]),
    "rep_error": pack([2, I32(-600), "unknown method 999"]),
    "rep_ping": pack([3, I32(0), {"view_version": 7}]),
    "rep_list_keys": pack([4, I32(0), {"keys": ["a", "b"], "next_cursor": None}]),
    "rep_replicas": pack([5, I32(0), [replica, replica]]),
    "rep_batch": pack([6, I32(0), [True, False, -704, True]]),
    "bad_huge_array": bytes.fromhex("930502" "dd" "ffffffff"),  # [5, 2, array32(2^32-1)...
    "bad_trailing": pack([8, 2, []]) + b"\xc0",
    # msgpack-c leaves the pointer of an empty string NULL (found by fuzzing)
    "regress_empty_str_key": pack([10, 2, [{"": 1}, "", b""]]),
}
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_frame")
os.makedirs(here, exist_ok=True)
for name, body in seeds.items():
    with open(os.path.join(here, name), "wb") as f:
        f.write(frame(body))
# One with an ext object (fixext 4), hand-encoded.
with open(os.path.join(here, "req_ext"), "wb") as f:
    f.write(frame(bytes.fromhex("930902" "91" "d6" "01" "deadbeef")))  # [9, 2, [fixext4]]
