import functools
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from ptspeed.envbuild import lock_hash
from ptspeed.matrix import (
    ConfigError,
    cells,
    check_config,
    model_sizes,
    runtime_minutes,
)


def validated_config(raw):
    try:
        validate(raw, schema="../schemas/config.schema.yaml", set_default=True)
    except WorkflowError as exc:
        raise WorkflowError(f"config: {schema_error(exc)}") from None
    for key, default in (("warmup", 3), ("measured", 10), ("numerics", 2)):
        raw["steps"].setdefault(key, default)
    return raw


def schema_error(exc):
    """'key.path: message' of the schema violation that ``validate`` wrapped in ``exc``."""
    error = exc.__context__
    if error is None or not hasattr(error, "absolute_path"):
        return first_line(exc)
    key = ".".join(str(part) for part in error.absolute_path)
    return f"{key}: {error.message}" if key else error.message


def first_line(exc):
    text = " ".join(str(a) for a in exc.args) or str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    detail = [line for line in lines if not line.startswith("Error validating")]
    return detail[0] if detail else lines[0]


def detect_device_class(requested):
    if requested != "auto":
        return requested
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return "cuda" if listed.returncode == 0 and "GPU" in listed.stdout else "cpu"


config = validated_config(config)
DEVICE_CLASS = detect_device_class(config["device"])
try:
    check_config(config, DEVICE_CLASS)
except ConfigError as exc:
    raise WorkflowError(f"config: {exc}") from None

RESULTS = config["results"]
ENV_CACHE = Path(config["env_cache"]).expanduser().resolve()
ENVIRONMENTS = config["environments"]
CELLS = list(cells(config, DEVICE_CLASS))
NAME = r"[a-z0-9][a-z0-9._-]*"
HOST_PYTHON = shlex.quote(sys.executable)


wildcard_constraints:
    env="|".join(map(re.escape, ENVIRONMENTS)),
    model=NAME,
    variant=NAME,
    mode="train|infer",
    size=r"b[0-9]+(-i[0-9]+)?(-s[0-9]+)?",
    trial=r"[0-9]+",


def record_paths(wildcards):
    """Every record of the matrix. An input function rather than a list: Snakemake maps each
    input file to the item it came from and hashes that item per file, which for a
    2,000-file list is quadratic (seconds of DAG building)."""
    return RECORD_PATHS


RECORD_PATHS = [f"{RESULTS}/{cell.path}" for cell in CELLS]


def uses_container(env):
    """Whether cells of ``env`` run in its image: kind container, or any env under
    --use-singularity / --sdm apptainer when it names an image."""
    deployment = {
        str(m).lower() for m in workflow.deployment_settings.deployment_method
    }
    in_apptainer = any("apptainer" in m or "singularity" in m for m in deployment)
    spec = ENVIRONMENTS[env]
    return spec["kind"] == "container" or (in_apptainer and bool(spec.get("container")))


def env_container(wildcards):
    env = wildcards.env
    return ENVIRONMENTS[env].get("container") if uses_container(env) else None


def venv_dir(env):
    spec = ENVIRONMENTS[env]
    return ENV_CACHE / f"{env}-{lock_hash(spec['requirements'])}"


def env_ready_file(wildcards):
    """The build_env output a cell waits for (none for host and container cells)."""
    if ENVIRONMENTS[wildcards.env]["kind"] != "venv" or uses_container(wildcards.env):
        return []
    return f"{RESULTS}/envs/{wildcards.env}.json"


def env_python(wildcards):
    return interpreter(wildcards.env)


@functools.cache
def interpreter(env):
    """The shell-quoted Python that runs the cells of ``env``, worked out once per environment
    (it hashes the lock file: 2,000 cells would do that 2,000 times)."""
    if uses_container(env):
        return "python"
    if ENVIRONMENTS[env]["kind"] == "host":
        return shlex.quote(sys.executable)
    return shlex.quote(str(Path(venv_dir(env)).resolve() / "bin" / "python"))


def cell_arguments(wildcards, threads):
    sizes = model_sizes(config, wildcards.model, DEVICE_CLASS)
    arguments = [
        "--env",
        wildcards.env,
        "--model",
        wildcards.model,
        "--variant",
        wildcards.variant,
        "--knobs",
        config["variants"][wildcards.variant],
        "--mode",
        wildcards.mode,
        "--batch-size",
        sizes.batch_size,
        "--image-size",
        sizes.image_size,
        "--seq-len",
        sizes.seq_len,
        "--trial",
        wildcards.trial,
        "--warmup",
        config["steps"]["warmup"],
        "--steps",
        config["steps"]["measured"],
        "--numerics-steps",
        config["steps"]["numerics"],
        "--device",
        DEVICE_CLASS,
        "--threads",
        threads if DEVICE_CLASS == "cpu" else 0,
        "--timeout",
        config["timeout_s"],
    ]
    return " ".join(shlex.quote(str(a)) for a in arguments)


def cell_threads():
    return config["threads"] or workflow.cores or 1


def trial_priority(wildcards):
    return config["trials"] - int(wildcards.trial)


def cell_gpus(wildcards):
    return 1 if DEVICE_CLASS == "cuda" else 0


def effective_config_json():
    """The config as the cells saw it, with device auto resolved to the class used."""
    return json.dumps(
        {**config, "device": DEVICE_CLASS}
    )  # config order: comparisons as listed
