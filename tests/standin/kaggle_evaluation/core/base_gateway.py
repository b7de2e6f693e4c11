"""The gateway's checks and outputs, as the real base_gateway has them: every batch of predictions
has the batch's row count and its row ids (the first column of the validation batch) in order;
the predictions are concatenated into submission.parquet in the working folder; during the rerun
a result.json says whether it succeeded."""

import enum
import json
import os
import re

import grpc
import pandas as pd

from . import relay

IS_RERUN = os.getenv("KAGGLE_IS_COMPETITION_RERUN") is not None


class GatewayRuntimeErrorType(enum.Enum):
    UNSPECIFIED = 0
    SERVER_NEVER_STARTED = 1
    SERVER_CONNECTION_FAILED = 2
    SERVER_RAISED_EXCEPTION = 3
    SERVER_MISSING_ENDPOINT = 4
    GATEWAY_RAISED_EXCEPTION = 5
    INVALID_SUBMISSION = 6


class GatewayRuntimeError(Exception):
    def __init__(self, error_type: GatewayRuntimeErrorType, error_details: str | None = None):
        super().__init__(f"{error_type.name}: {error_details}")
        self.error_type = error_type
        self.error_details = error_details


def _ids(frame, column) -> list:
    return [str(v) for v in list(frame[column])]


class BaseGateway:
    def __init__(self, data_paths=None, file_share_dir=None):
        host = os.environ.get("KAGGLE_EVALUATION_HOST", "inference_server" if IS_RERUN else "localhost")
        self.client = relay.Client(host)
        self.server = None
        self.data_paths = data_paths
        self.file_share_dir = file_share_dir

    def validate_prediction_batch(self, prediction_batch, sample_submission_batch):
        if prediction_batch is None:
            raise GatewayRuntimeError(GatewayRuntimeErrorType.INVALID_SUBMISSION, "No prediction received")
        if len(prediction_batch) != len(sample_submission_batch):
            raise GatewayRuntimeError(
                GatewayRuntimeErrorType.INVALID_SUBMISSION,
                f"Invalid predictions: expected {len(sample_submission_batch)} rows "
                f"but received {len(prediction_batch)}",
            )
        row_id = sample_submission_batch.columns[0]
        if row_id not in prediction_batch.columns:
            raise GatewayRuntimeError(GatewayRuntimeErrorType.INVALID_SUBMISSION, f"Prediction missing column {row_id}")
        if _ids(prediction_batch, row_id) != _ids(sample_submission_batch, row_id):
            raise GatewayRuntimeError(
                GatewayRuntimeErrorType.INVALID_SUBMISSION, f"Invalid values for {row_id} in batch of predictions."
            )

    def write_submission(self, predictions):
        if isinstance(predictions[0], pd.DataFrame):
            pd.concat(predictions, ignore_index=True).to_parquet("submission.parquet", index=False)
            return
        import polars as pl

        try:
            pl.concat(predictions, how="vertical_relaxed").write_parquet("submission.parquet")
        except (TypeError, pl.exceptions.PolarsError) as e:
            raise GatewayRuntimeError(
                GatewayRuntimeErrorType.INVALID_SUBMISSION, f"Inconsistent predictions: {e}"
            ) from None

    def write_result(self, error=None):
        result = {"Succeeded": error is None}
        if error is not None:
            result.update(ErrorType=error.error_type.value, ErrorName=error.error_type.name)
            result["ErrorDetails"] = str(error.error_details)[:8000] if error.error_details else None
        with open("result.json", "w") as f:
            json.dump(result, f)

    def handle_server_error(self, exception: Exception, endpoint: str):
        text = str(exception)
        if isinstance(exception, RuntimeError) and "Failed to connect to server" in text:
            raise GatewayRuntimeError(GatewayRuntimeErrorType.SERVER_NEVER_STARTED) from None
        if f"No listener for {endpoint} was registered" in text:
            raise GatewayRuntimeError(GatewayRuntimeErrorType.SERVER_MISSING_ENDPOINT, text) from None
        if "Exception calling application" in text:
            match = re.search(r"Exception calling application: (.*?)\"", text)
            raise GatewayRuntimeError(
                GatewayRuntimeErrorType.SERVER_RAISED_EXCEPTION, match.group(1) if match else text
            ) from None
        if isinstance(exception, grpc.RpcError):
            raise GatewayRuntimeError(GatewayRuntimeErrorType.SERVER_CONNECTION_FAILED, text) from None
        raise exception
