"""A streaming competition's gateway, as kagtpl's tests run it: the test table (data_paths[0],
default: test.csv beside this package) goes out in batches, one predict(batch) call each. A batch
is the rows of one value of STANDIN_BATCH_COL (a time step, as in Jane Street's date_id), or else
STANDIN_BATCH_ROWS rows; it travels as a polars frame (STANDIN_FRAME=pandas for pandas). The first
call has no deadline of its own (the server may load its models then); every later one must
answer within STANDIN_CALL_LIMIT seconds (60 by default)."""

import os
from pathlib import Path

import pandas as pd

from kaggle_evaluation.core import templates


class KagtplGateway(templates.Gateway):
    def __init__(self, data_paths=None):
        super().__init__(data_paths)
        self.call_limit = float(os.environ.get("STANDIN_CALL_LIMIT", "60"))

    def unpack_data_paths(self):
        default = Path(__file__).resolve().parents[1] / "test.csv"
        self.test_path = Path(self.data_paths[0]) if self.data_paths else default

    def generate_data_batches(self):
        test = pd.read_csv(self.test_path, dtype={0: str})
        row_id = test.columns[0]
        column = os.environ.get("STANDIN_BATCH_COL")
        size = int(os.environ.get("STANDIN_BATCH_ROWS", "25"))
        groups = test.groupby(column, sort=False) if column else test.groupby(test.index // size, sort=False)
        polars = os.environ.get("STANDIN_FRAME", "polars") == "polars"
        for n, (_, batch) in enumerate(groups):
            batch = batch.reset_index(drop=True)
            if n == 1:  # the deadline applies from the second call on
                self.set_response_timeout_seconds(self.call_limit)
            if polars:
                import polars as pl

                yield (pl.from_pandas(batch),), pl.from_pandas(batch[[row_id]])
            else:
                yield (batch,), batch[[row_id]]
