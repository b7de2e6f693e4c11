from kaggle_evaluation.core import templates
from kaggle_evaluation.kagtpl_gateway import KagtplGateway


class KagtplInferenceServer(templates.InferenceServer):
    def _get_gateway_for_test(self, data_paths=None, file_share_dir=None):
        return KagtplGateway(data_paths)
