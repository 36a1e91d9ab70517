"""The MLflow connector: MLflow's webhook gates alias moves (service.integrations.mlflow.router),
jobs import, gate, tag, promote and revert (worker.mlflow), the sweeper reconciles."""
