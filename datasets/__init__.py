"""dispatchtune.datasets: the benchmark-log record format, loaders and the shipped datasets.

- `records`: the `results.jsonl` format the tuning loop writes (`ResultsLog`, `load_results`);
- `kerneltuner`: Kernel Tuner cache files read as tables (their feature mapping is in
  `features.kerneltuner`);
- `spaces`: the one loader of measured spaces (`load_spaces`) for training and evaluation;
- `shipped`: datasets installed with the package, addressed as `shipped:NAME`.
"""

from dispatchtune.datasets.records import ResultRecord, ResultsLog, load_results, read_records
from dispatchtune.datasets.shipped import SHIPPED, resolve, shipped_path

__all__ = ["SHIPPED", "ResultRecord", "ResultsLog", "load_results", "read_records", "resolve",
           "shipped_path"]
