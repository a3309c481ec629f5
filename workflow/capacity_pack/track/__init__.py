"""MLflow tracking: parent run per frozen manifest, one child run per job."""
