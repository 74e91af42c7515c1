"""Another writer and reader of the ckptfs store format, using only Python's tarfile,
gzip, hashlib and boto3 (the "other tools" of SPEC section 1).

Usage:
  interop.py build SRC OUT --format {pax,gnu,ustar} [--dot] [--multi-member]
      Write a .tar.gz of the tree SRC to OUT; print "<sha256> <size>".
      --dot: member names start with "./" (and "." is the first member), as
      `tar -C SRC -czf OUT .` writes them. --multi-member: two gzip members.
  interop.py upload ENDPOINT BUCKET PREFIX ARCHIVE [--no-metadata]
      Upload ARCHIVE as PREFIX/<sha256>.tar.gz with boto3 (user metadata sha256 and
      size unless --no-metadata); print "<sha256> <size>".
  interop.py inspect ENDPOINT BUCKET KEY OUT
      Download KEY to OUT; print JSON {"sha256", "length", "metadata"}.

Credentials and region come from the usual AWS environment variables.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile


def s3_client(endpoint):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        config=Config(s3={"addressing_style": "path"}),
    )


def build(args):
    formats = {
        "pax": tarfile.PAX_FORMAT,
        "gnu": tarfile.GNU_FORMAT,
        "ustar": tarfile.USTAR_FORMAT,
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=formats[args.format]) as tar:
        if args.dot:
            tar.add(args.src, arcname=".")
        else:
            for name in sorted(os.listdir(args.src)):
                tar.add(os.path.join(args.src, name), arcname=name)
    data = raw.getvalue()
    if args.multi_member:
        cut = len(data) // 2
        blob = gzip.compress(data[:cut]) + gzip.compress(data[cut:])
    else:
        blob = gzip.compress(data)
    with open(args.out, "wb") as f:
        f.write(blob)
    print(hashlib.sha256(blob).hexdigest(), len(blob))


def upload(args):
    with open(args.archive, "rb") as f:
        blob = f.read()
    sha = hashlib.sha256(blob).hexdigest()
    key = f"{args.prefix.strip('/')}/{sha}.tar.gz" if args.prefix.strip("/") else f"{sha}.tar.gz"
    extra = {}
    if not args.no_metadata:
        extra["Metadata"] = {"sha256": sha, "size": str(len(blob))}
    s3_client(args.endpoint).put_object(Bucket=args.bucket, Key=key, Body=blob, **extra)
    print(sha, len(blob))


def inspect(args):
    obj = s3_client(args.endpoint).get_object(Bucket=args.bucket, Key=args.key)
    blob = obj["Body"].read()
    with open(args.out, "wb") as f:
        f.write(blob)
    json.dump(
        {
            "sha256": hashlib.sha256(blob).hexdigest(),
            "length": len(blob),
            "content_length": obj["ContentLength"],
            "metadata": obj.get("Metadata", {}),
        },
        sys.stdout,
    )
    print()


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build")
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--format", choices=["pax", "gnu", "ustar"], default="pax")
    p.add_argument("--dot", action="store_true")
    p.add_argument("--multi-member", action="store_true")
    p.set_defaults(func=build)
    p = sub.add_parser("upload")
    p.add_argument("endpoint")
    p.add_argument("bucket")
    p.add_argument("prefix")
    p.add_argument("archive")
    p.add_argument("--no-metadata", action="store_true")
    p.set_defaults(func=upload)
    p = sub.add_parser("inspect")
    p.add_argument("endpoint")
    p.add_argument("bucket")
    p.add_argument("key")
    p.add_argument("out")
    p.set_defaults(func=inspect)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
