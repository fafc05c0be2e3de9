#!/usr/bin/env python3
"""Writes the seed corpus of the bootstrap_frames fuzzer (corpus/bootstrap_frames/).

Each seed is one byte choosing how the stream is cut into reads, then the bytes a root
receives from one connection, in the frame layout of lib/core/bootstrap_protocol.h.
"""
import os
import struct

MAGIC = 0x57465442
HELLO, ALLGATHER, GOODBYE, ABORTING, FAILED, SHRINK = 1, 3, 5, 6, 10, 11


def frame(kind, payload, length=None):
    return struct.pack("<IIQ", MAGIC, kind, len(payload) if length is None else length) + payload


def blob(data):
    return struct.pack("<I", len(data)) + data


def hello(rank, nranks, secret=bytes(range(16)), version=2):
    return struct.pack("<I", version) + secret + struct.pack("<ii", rank, nranks) + \
        blob(b"host:1234") + blob(b"peer info")


def ranks(values):
    return struct.pack("<I", len(values)) + b"".join(struct.pack("<i", r) for r in values)


session = (frame(HELLO, hello(1, 4)) +
           frame(ALLGATHER, struct.pack("<Q", 0) + blob(b"part") + struct.pack("<q", 5000)) +
           frame(FAILED, blob(b"rank 1 timed out") + ranks([2])) +
           frame(SHRINK, struct.pack("<Q", 0) + ranks([3]) + blob(b"survivor")) +
           frame(FAILED, blob(b"revoked") + ranks([])) +
           frame(GOODBYE, b"launched") + frame(ABORTING, b""))
seeds = {
    "session_whole": b"\x3f" + session,
    "session_bytewise": b"\x00" + session,
    "hello_only": b"\x07" + frame(HELLO, hello(0, 2)),
    "hello_truncated": b"\x3f" + frame(HELLO, hello(0, 2)[:30]),
    "hello_old_version": b"\x3f" + frame(HELLO, hello(0, 2, version=7)),
    "bad_magic": b"\x3f" + struct.pack("<IIQ", 0x12345678, HELLO, 4) + b"abcd",
    "oversized_length": b"\x3f" + frame(HELLO, b"", length=1 << 40),
    "allgather_before_hello": b"\x3f" + frame(ALLGATHER, struct.pack("<Q", 0) + blob(b"x")),
    "shrink_out_of_range": b"\x3f" + frame(HELLO, hello(0, 2)) +
    frame(SHRINK, struct.pack("<Q", 1) + ranks([5]) + blob(b"")),
}
folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "bootstrap_frames")
os.makedirs(folder, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(folder, name), "wb") as out:
        out.write(data)
