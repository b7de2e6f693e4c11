"""The machinery kagtpl generates: read it when curious, edit it rarely. `kagtpl update` improves it.

Your competition code is train.py, predict.py, tune.py and run.py one folder up; they import what
they need from here. One module per concern:

    errors.py       the three error kinds and the one-line error a script exits with
    hardware.py     GPU profiles, batch / worker / precision rules (shared with `kagtpl recommend`)
    gpu.py          the device, its kernels, AMP, the memory monitor and the batch probe
    planner.py      the time budget: estimate, plan, deadline guard, give-back
    reserve.py      ...the prediction reserve: predict.py's share of the budget
    timings.py      ...what the run measured, fold by fold (epochs, folds, curves)
    growth.py       spare budget spent: more seeds (and epochs) of the same folds
    tta_views.py    ...and more TTA views, when the OOF rows say they help
    engine.py       cross_validate: the fold loop, the epoch loop, OOF and checkpoints
    parallel.py     fold workers, DDP and the gradient sync
    storage.py      atomic writes, locks, folds and OOF files, the run signature
    submission.py   reading the sample submission and writing submission.csv
    prediction.py   predict.py's core: its start, the fold loop, serve.py's ensemble
    experiments.py  output/experiments.csv; `python -m machinery.experiments` lists runs, best CV first
    logs.py         the log lines agents read (docs/log-format.md in kagtpl)
    report.py       the training-curve report
    tuning.py       tune.py's optuna search
"""
