"""A consumer process for the kill test: trains batches from a stream loader and
logs each trained row; optionally hangs mid-batch so the test can SIGKILL it."""

from __future__ import annotations

import argparse
import os
import time

from rljob.transferqueue import TransferQueueClient
from rljob.transferqueue.loader import stream_loader


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("log")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--train-seconds", type=float, default=0.05)
    ap.add_argument("--hang-on-batch", type=int, default=0)
    ap.add_argument("--marker", default="")
    args = ap.parse_args()
    with TransferQueueClient(args.address) as client, open(args.log, "a") as log:
        loader = stream_loader(client, "train", ["payload"], args.batch, wait=0.5,
                               min_count=1, stop_when_idle=4.0)
        for n, batch in enumerate(loader, 1):
            for idx, payload in zip(batch.indices, batch.data["payload"]):
                assert int(payload[0]) == idx  # the row's own data came back
            if n == args.hang_on_batch:
                # written whole, then renamed: the test never reads half a list
                with open(args.marker + ".tmp", "w") as m:
                    m.write(",".join(map(str, batch.indices)))
                os.replace(args.marker + ".tmp", args.marker)
                time.sleep(3600)  # "training" until killed
            time.sleep(args.train_seconds)
            log.write("".join(f"{i}\n" for i in batch.indices))
            log.flush()
            os.fsync(log.fileno())


if __name__ == "__main__":
    main()
