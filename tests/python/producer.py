#!/usr/bin/env python3
"""A groupcast producer written from schemas/README.md alone.

Cuts a batch of generated recipients into chunks and appends them, shuffled and
a few of them twice, to the ingest stream of the batch's shard. With
--malformed it also appends bad entries, each of which groupcast must
dead-letter with a reason while the batch itself goes through:

  garbage          `d` is not MessagePack
  unknown_version  `v` is "2"
  invalid_chunk    a chunk whose recipient lacks a placeholder's value
  beyond_last      a chunk with a seq beyond the last one
  conflict         the last seq again, with other content

The last two are only meaningful once the batch's last chunk was accepted (see
"Sequence rules" in the README: a seq beyond the last that arrives *before*
the last chunk makes groupcast refuse the last chunk instead), so the producer
first waits for the last chunk's `chunk_assigned` event on the batch's event
stream.

Prints a JSON summary on stdout. Needs: pip install redis msgpack
"""

import argparse
import json
import random
import sys
import time

try:
    import msgpack
    import redis
except ImportError as e:  # pragma: no cover - exercised by a missing install
    sys.stderr.write(
        f"producer.py: missing Python package ({e}). Install them with: pip install redis msgpack\n"
    )
    sys.exit(3)

# Limits from schemas/README.md ("Limits").
MAX_CHUNK_RECIPIENTS = 10000
MAX_CHUNK_BYTES = 8388608
MAX_TEXT_CHARS = 4000
MAX_VAR_CHARS = 1000
MAX_BATCH_ID_LEN = 128
MAX_NUMBER_LEN = 32
BATCH_ID_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")

TEMPLATE = {
    "type": "ATA",
    "from": "0212345678",
    "text": "#{name}님, 주문 #{order} 배송이 시작되었습니다.",
    "kakao_options": {"pf_id": "PF-python", "template_id": "ORDER_SHIPPED"},
}

GARBAGE = b"\xc1\xff\x00 not messagepack"


class ProducerError(Exception):
    pass


def shard_of(batch: str, shards: int) -> int:
    """FNV-1a (32 bit) of the batch id's UTF-8 bytes, modulo the shard count."""
    h = 0x811C9DC5
    for b in batch.encode("utf-8"):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % max(shards, 1)


SLOTS = 16384
MAX_SHARDS = 1024


def crc16(data: bytes) -> int:
    """CRC16/XMODEM, Redis Cluster's key hash."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def shard_tag(k: int, shards: int) -> str:
    """The hash tag of shard k of `shards`: `s<k>`, or the first `s<k>-<j>`
    (j = 1, 2, ...), whose slot lies in [ceil(k*16384/n), floor((k+1)*16384/n))."""
    lo, hi = -(-k * SLOTS // shards), (k + 1) * SLOTS // shards
    tag, j = f"s{k}", 0
    while not lo <= crc16(tag.encode()) % SLOTS < hi:
        j += 1
        tag = f"s{k}-{j}"
    return tag


def ingest_key(prefix: str, tag: str) -> str:
    return f"{prefix}:{{{tag}}}:ingest"


def events_key(prefix: str, tag: str, batch: str) -> str:
    return f"{prefix}:{{{tag}}}:b:{batch}:events"


def parse_shards(text: str):
    """`auto` (None) or a shard count from 1 to MAX_SHARDS."""
    if text.strip().lower() == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_SHARDS:
        raise argparse.ArgumentTypeError(f"give auto or a number from 1 to {MAX_SHARDS}")
    return n


def deployment_shards(r, prefix: str, asked) -> int:
    """The deployment's shard count, as in README section 1: `<prefix>:shards`
    if recorded (a different explicit count is refused), else recorded now
    with SET NX (1 on a single server, one per master on a cluster)."""
    key = f"{prefix}:shards"
    recorded = r.get(key)
    if recorded is None:
        want = asked
        if want is None:
            want = 1
            if r.info("cluster").get("cluster_enabled") == 1:
                masters = {(m[0], m[1]) for (_, _, m, *_) in r.execute_command("CLUSTER", "SLOTS")}
                want = min(max(len(masters), 1), MAX_SHARDS)
        r.set(key, want, nx=True)
        recorded = r.get(key)
    n = int(recorded)
    if asked is not None and asked != n:
        raise ProducerError(f"the deployment uses {n} shards ({key}), not {asked}")
    return n


def check_batch_id(batch: str) -> None:
    if not batch:
        raise ProducerError("batch id is empty")
    if len(batch.encode("utf-8")) > MAX_BATCH_ID_LEN:
        raise ProducerError(f"batch id is longer than {MAX_BATCH_ID_LEN} bytes")
    bad = [c for c in batch if c not in BATCH_ID_CHARS]
    if bad:
        raise ProducerError(f"batch id has the character {bad[0]!r}; only letters, digits, '.', '_' and '-' are allowed")


def placeholders(text: str) -> list:
    names, rest = [], text
    while "#{" in rest:
        rest = rest[rest.index("#{") + 2:]
        if "}" not in rest:
            break
        name, rest = rest.split("}", 1)
        if name and name not in names:
            names.append(name)
    return names


def encode(chunk: dict) -> bytes:
    """The `d` field: a MessagePack map with named fields, strings as str."""
    return msgpack.packb(chunk, use_bin_type=True)


def check_chunk(chunk: dict) -> bytes:
    """Checks the README's rules before sending; returns the encoded chunk."""
    check_batch_id(chunk["batch"])
    t = chunk["template"]
    if t["type"] not in ("SMS", "LMS", "ATA", "CTA"):
        raise ProducerError(f"template type {t['type']!r} is not one of SMS, LMS, ATA, CTA")
    if t["type"] in ("ATA", "CTA") and not t.get("kakao_options"):
        raise ProducerError(f"template type {t['type']} needs kakao_options")
    if not t["from"].strip():
        raise ProducerError("template has no from number")
    if len(t["text"]) > MAX_TEXT_CHARS:
        raise ProducerError(f"template text is over {MAX_TEXT_CHARS} characters")
    recipients = chunk["recipients"]
    if not recipients:
        raise ProducerError("chunk has no recipients")
    if len(recipients) > MAX_CHUNK_RECIPIENTS:
        raise ProducerError(
            f"chunk has {len(recipients)} recipients; at most {MAX_CHUNK_RECIPIENTS} are allowed"
        )
    names = placeholders(t["text"])
    # A repeated number is not an error: groupcast sends it once per batch.
    for i, r in enumerate(recipients):
        if not r["to"] or len(r["to"]) > MAX_NUMBER_LEN:
            raise ProducerError(f"recipient {i} has an unusable number {r['to']!r}")
        vars_ = r.get("vars", {})
        for n in names:
            if n not in vars_:
                raise ProducerError(f"recipient {i} has no value for placeholder #{{{n}}}")
        for n, v in vars_.items():
            if not isinstance(v, str):
                raise ProducerError(f"recipient {i} variable {n} is not a string")
            if len(v) > MAX_VAR_CHARS:
                raise ProducerError(f"recipient {i} variable {n} is longer than {MAX_VAR_CHARS} characters")
    d = encode(chunk)
    if len(d) > MAX_CHUNK_BYTES:
        raise ProducerError(f"chunk is {len(d)} bytes; at most {MAX_CHUNK_BYTES} are allowed")
    return d


def recipient(base: int, i: int) -> dict:
    return {"to": f"010{base * 1_000_000 + i:08d}", "vars": {"name": f"고객{i}", "order": f"P{i}"}}


def cut(batch: str, total: int, size: int, base: int, options: dict) -> list:
    """Chunks with seq from 0; only the highest seq is flagged last. The
    batch options (if any) go in every chunk, the same."""
    people = [recipient(base, i) for i in range(total)]
    parts = [people[i:i + size] for i in range(0, total, size)]
    chunks = [
        {"batch": batch, "seq": seq, "last": seq == len(parts) - 1, "template": TEMPLATE, "recipients": part}
        for seq, part in enumerate(parts)
    ]
    if options:
        for c in chunks:
            c["options"] = options
    return chunks


def xadd_all(r, stream: str, entries: list) -> list:
    pipe = r.pipeline(transaction=False)
    for fields in entries:
        pipe.xadd(stream, fields)
    return [i.decode() for i in pipe.execute()]


def wait_assigned(r, key: str, seq: int, timeout: float) -> None:
    """Waits until the batch's event stream has `chunk_assigned` for `seq`."""
    deadline = time.monotonic() + timeout
    last_id = "0-0"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProducerError(f"seq {seq} was not assigned within {timeout} s (are workers running?)")
        got = r.xread({key: last_id}, count=500, block=max(1, int(min(left, 1.0) * 1000)))
        for _stream, entries in got or []:
            for entry_id, fields in entries:
                last_id = entry_id
                if fields.get(b"v") != b"1" or fields.get(b"t") != b"chunk_assigned":
                    continue
                d = msgpack.unpackb(fields[b"d"], raw=False)
                if d["seq"] == seq and d["last"]:
                    return


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis URL")
    p.add_argument("--prefix", default="gc", help="the workers' key prefix")
    p.add_argument("--shards", type=parse_shards, default=None,
                   help="the deployment's shard count: auto (the default: read from <prefix>:shards) or a number")
    p.add_argument("--batch", required=True, help="the batch id")
    p.add_argument("--recipients", type=int, default=1000, help="how many recipients to generate")
    p.add_argument("--chunk-size", type=int, default=500, help="recipients per chunk")
    p.add_argument("--number-base", type=int, default=7, help="numbers are 010 + base*10^6 + i (8 digits)")
    p.add_argument("--seed", type=int, default=1, help="shuffle seed")
    p.add_argument("--malformed", action="store_true", help="also append malformed entries")
    p.add_argument("--wait-timeout", type=float, default=60.0, help="seconds to wait for the last chunk's assignment")
    p.add_argument("--print-shard", action="store_true", help="print the batch's shard and exit (needs --shards N)")
    p.add_argument("--print-stream", action="store_true", help="print the batch's ingest stream and exit (needs --shards N)")
    p.add_argument("--send-at", help="the batch's send_at (RFC 3339 with an offset)")
    p.add_argument("--priority", choices=["urgent", "normal", "bulk"], help="the batch's lane")
    args = p.parse_args(argv)

    try:
        check_batch_id(args.batch)
        if args.print_shard or args.print_stream:
            if args.shards is None:
                raise ProducerError("--print-shard and --print-stream need --shards N")
            shard = shard_of(args.batch, args.shards)
            print(shard if args.print_shard else ingest_key(args.prefix, shard_tag(shard, args.shards)))
            return 0
        if args.recipients < 1:
            raise ProducerError("--recipients must be at least 1")
        if not 1 <= args.chunk_size <= MAX_CHUNK_RECIPIENTS:
            raise ProducerError(f"--chunk-size must be 1..{MAX_CHUNK_RECIPIENTS} (at most {MAX_CHUNK_RECIPIENTS} recipients per chunk)")
        options = {}
        if args.send_at:
            options["send_at"] = args.send_at
        if args.priority:
            options["priority"] = args.priority
        chunks = cut(args.batch, args.recipients, args.chunk_size, args.number_base, options)
        encoded = [check_chunk(c) for c in chunks]
    except ProducerError as e:
        sys.stderr.write(f"producer.py: {e}\n")
        return 2

    r = redis.Redis.from_url(args.redis)
    try:
        shards = deployment_shards(r, args.prefix, args.shards)
    except ProducerError as e:
        sys.stderr.write(f"producer.py: {e}\n")
        return 2
    shard = shard_of(args.batch, shards)
    tag = shard_tag(shard, shards)
    stream = ingest_key(args.prefix, tag)
    rng = random.Random(args.seed)
    entries = [{"v": "1", "t": "chunk", "d": d} for d in encoded]
    repeats = entries[::3]  # a few chunks twice
    entries = entries + repeats
    rng.shuffle(entries)

    ids = xadd_all(r, stream, entries)
    summary = {
        "batch": args.batch,
        "shard": shard,
        "stream": stream,
        "chunks": len(chunks),
        "last_seq": len(chunks) - 1,
        "recipients": args.recipients,
        "entries": len(ids),
        "repeated": len(repeats),
        "malformed": [],
    }

    if args.malformed:
        last = len(chunks) - 1
        first = chunks[0]
        no_order = dict(first, recipients=[{"to": first["recipients"][0]["to"], "vars": {"name": "x"}}])
        early = [
            ("garbage", {"v": "1", "t": "chunk", "d": GARBAGE}),
            ("unknown_version", {"v": "2", "t": "chunk", "d": encoded[0]}),
            ("invalid_chunk", {"v": "1", "t": "chunk", "d": encode(no_order)}),
        ]
        # Valid chunks, with numbers of their own, that only break sequence rules.
        fresh = [recipient(args.number_base + 1, i) for i in range(3)]
        beyond = dict(chunks[last], seq=last + 1, last=False, recipients=fresh)
        other = dict(chunks[last], recipients=fresh)
        late = [
            ("beyond_last", {"v": "1", "t": "chunk", "d": check_chunk(beyond)}),
            ("conflict", {"v": "1", "t": "chunk", "d": check_chunk(other)}),
        ]
        early_ids = xadd_all(r, stream, [f for _, f in early])
        try:
            wait_assigned(r, events_key(args.prefix, tag, args.batch), last, args.wait_timeout)
        except ProducerError as e:
            sys.stderr.write(f"producer.py: {e}\n")
            return 1
        late_ids = xadd_all(r, stream, [f for _, f in late])
        for (kind, fields), entry_id in zip(early + late, early_ids + late_ids):
            summary["malformed"].append({
                "kind": kind,
                "id": entry_id,
                "v": fields["v"],
                "t": fields["t"],
                "d_hex": fields["d"].hex(),
            })

    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
