"""Start N TensorFlow workers on this machine the way a cluster manager would: each process
gets its own TF_CONFIG and nothing else that names its rank (no MPI, no RANK variables).

    tf_config_launcher.py WORKERS [tf_train.py's arguments]   (on ports free at launch)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ps.tf_ps import free_ports  # (this folder is the script's: on sys.path)


def main() -> int:
    workers = int(sys.argv[1])
    script = Path(__file__).with_name("tf_train.py")
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(workers)]}
    procs = []
    for index in range(workers):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}
        )
        procs.append(subprocess.Popen([sys.executable, str(script), *sys.argv[2:]], env=env))
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
