"""``python -m benchmarks.s3_parts``: how the S3 part size and concurrency move a download.

Sweeps REGISTRY_S3_PART_SIZE x REGISTRY_S3_CONCURRENCY over one object on a moto server on
loopback and prints the median of 5 downloads (the store's ``get_to_file``: ranged GETs, hashed
as they arrive) for each pair, fastest first. This is how the defaults were chosen; on a real
bucket or MinIO, run it against that endpoint (``--endpoint``, credentials from the usual AWS
variables, ``--bucket`` must exist) before changing them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from registry.settings import Settings
from registry.store import open_store

from . import services

MiB = 2**20
PARTS = ["8MiB", "16MiB", "32MiB", "64MiB"]
CONCURRENCY = ["4", "8", "16"]


def sweep(endpoint: str, bucket: str, size: int, runs: int) -> list[tuple[float, str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = work / "src"
        src.write_bytes(os.urandom(size))
        env = {**os.environ, "REGISTRY_HOME": str(work / "home"),
               "REGISTRY_S3_ENDPOINT_URL": endpoint}
        open_store(f"s3://{bucket}/sweep", Settings.from_env(env)).put_file("blobs/x", src)
        out = []
        for part in PARTS:
            for conc in CONCURRENCY:
                settings = Settings.from_env({**env, "REGISTRY_S3_PART_SIZE": part,
                                              "REGISTRY_S3_CONCURRENCY": conc})
                store = open_store(f"s3://{bucket}/sweep", settings)
                times = []
                for _ in range(runs + 1):  # the first warms the connections
                    start = time.perf_counter()
                    store.get_to_file("blobs/x", work / "dl")
                    times.append(time.perf_counter() - start)
                out.append((statistics.median(times[1:]), part, conc))
                print(f"  {part:>6} x {conc:>2}: {out[-1][0] * 1000:.0f} ms", flush=True)
        return sorted(out)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.s3_parts", description=__doc__)
    parser.add_argument("--size", default=256, type=int, help="object size in MiB")
    parser.add_argument("--runs", default=5, type=int)
    parser.add_argument("--endpoint", help="an S3 endpoint (default: moto on loopback)")
    parser.add_argument("--bucket", default="registry-sweep")
    args = parser.parse_args()
    if args.endpoint:
        results = sweep(args.endpoint, args.bucket, args.size * MiB, args.runs)
    else:
        import boto3

        with services.moto_server() as moto:
            boto3.client("s3", endpoint_url=moto.url).create_bucket(Bucket=args.bucket)
            results = sweep(moto.url, args.bucket, args.size * MiB, args.runs)
    print(f"fastest first ({args.size} MiB, median of {args.runs}):")
    for seconds, part, conc in results:
        print(f"  part {part:>6}, concurrency {conc:>2}: {seconds * 1000:.0f} ms "
              f"({args.size * MiB / seconds / 1e9:.2f} GB/s)")


if __name__ == "__main__":
    main()
