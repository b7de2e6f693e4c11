"""Answer a competition served through Kaggle's evaluation API with the trained ensemble.

Code competitions like Jane Street, Mitsui or CMI hand the hidden test set to the notebook batch
by batch: their `kaggle_evaluation` package (in the competition's data) calls a `predict`
function once per batch. serve.py loads predict.py's ensemble once (the same checkpoints,
precision and checks), then answers each call with predict.py's predict_batch, timed and
guarded: a call that raises, answers the wrong rows or nears its limit is answered with the
fallback (SERVE and WARNING lines), so one bad batch never costs the submission.

    python serve.py                                  # dry run: the package's local gateway on the public test files
    python serve.py --data-paths test.parquet        # ... on files you name (the package's own arguments)
    KAGGLE_IS_COMPETITION_RERUN=1 python serve.py    # what Kaggle's rerun runs: serve until stopped
"""

import argparse
import time
from functools import partial
from pathlib import Path

import predict
from machinery import engine, errors, gpu, serving

STARTED = serving.process_start()


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=predict.DATA_DIR, help="competition folder with the kaggle_evaluation package")
    p.add_argument("--out-dir", default=predict.OUT_DIR, help="where train.py wrote model_fold*.pth")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--data-paths", nargs="*", default=None, help="dry run: the test files for the local gateway")
    # ---- the competition's limits: read them off its Evaluation page
    p.add_argument(
        "--startup-limit", type=float, default=900, help="seconds from the start until the server must answer (15 min)"
    )
    p.add_argument("--started", type=float, default=0, help="unix time the notebook started; 0 = this process's")
    p.add_argument(
        "--call-limit", type=float, default=60, help="seconds each call after the first may take; answers by 80%%"
    )
    p.add_argument("--first-call-limit", type=float, default=600, help="the first call's (it may warm up the card)")
    errors.one_line_errors(p)
    return p.parse_args(argv)


def main(argv=None):
    args = get_args(argv)
    limits = {"startup_limit": (1e-3, 86_400), "call_limit": (1e-3, 86_400), "first_call_limit": (1e-3, 86_400)}
    engine.check_flags(args, limits)
    device = gpu.resolve_device(args.device)  # a card this torch cannot run: one ERROR line, before any reading
    out = Path(args.out_dir)
    server_class = serving.find_server(Path(args.data_dir))  # no package: one ERROR line before any model is read
    defaults = serving.read_defaults(out)
    clock = serving.StartClock(args.started or STARTED, args.startup_limit)
    ensemble = predict.load_ensemble(out, Path(args.data_dir), defaults["columns"], device, clock)
    answerer = serving.Answerer(
        partial(predict.predict_batch, ensemble), defaults, args.call_limit, args.first_call_limit
    )

    def predict_fn(*batch, **kwargs):  # the gateway calls the endpoint by this name: `predict`
        return answerer(*batch, **kwargs)

    predict_fn.__name__ = "predict"
    server = server_class(predict_fn)
    late = " (past it: the gateway may have given up)" if clock.elapsed() > args.startup_limit else ""
    print(
        f"SERVE: started {clock.elapsed():.1f}s after the start, of the {args.startup_limit:g}s serving deadline{late}"
    )
    if serving.rerun():
        server.serve()  # blocks: the rerun's gateway calls until it has every batch
        return
    t0 = time.time()
    try:
        server.run_local_gateway(tuple(args.data_paths) if args.data_paths else None)
    except Exception as e:  # the package's own error (GatewayRuntimeError): what the rerun would fail with
        raise errors.RunError(f"the local gateway failed: {type(e).__name__}: {e}") from None
    print(f"SERVE: dry run done in {time.time() - t0:.1f}s: {answerer.summary()}")
    serving.check_dry_run(Path("submission.parquet"), answerer)


if __name__ == "__main__":
    errors.main(main)
