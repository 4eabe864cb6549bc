"""Resources that place jobs on a cluster, from params (docs/cluster.md).

Cluster executors turn them into scheduler options (workflow/profiles/slurm: sbatch); local
runs ignore them. A resource a rule sets here replaces the profile's default-resources value
for it, and the profile's set-resources replace both.
"""

from collections.abc import Callable

from snakemake.iocontainers import InputFiles, Wildcards
from snakemake.resources import Resources

# cluster.devices field -> the resource snakemake-executor-plugin-slurm passes to sbatch as
PLACEMENT = {
    "partition": "slurm_partition",  # --partition
    "constraint": "constraint",  # --constraint
    "gpus": "gpu",  # --gpus
    "runtime": "runtime",  # --time, minutes
    "mem_mb": "mem_mb",  # --mem
}
# What a resource function returns to request nothing: None, but a size must be a number (the
# plugin passes --mem for a positive mem_mb only).
NO_REQUEST = {"mem_mb": 0}


def default_resource(name: str, rule: str, wildcards: Wildcards, input: InputFiles,
                     threads: int, attempt: int) -> object:
    """What --default-resources (a profile's default-resources) gives resource `name` for a job
    of `rule`; None when it gives nothing. A rule's resource function replaces the default even
    when it returns None, so it asks here to fall back to it."""
    defaults = workflow.resource_settings.default_resources
    if not defaults or name not in defaults:
        return None
    resource = Resources.from_mapping(defaults)[name]
    return resource.evaluate(wildcards, input=input, threads=threads, attempt=attempt,
                             rulename=rule, async_run=workflow.async_run).value


def device_placement(field: str) -> Callable[..., object]:
    """A resource function: the `field` of cluster.devices for the job's {device}, else the
    default resource (a device without an entry is placed like any other job)."""

    def value(wildcards: Wildcards, input: InputFiles, threads: int, attempt: int) -> object:
        entry = SETTINGS.cluster.devices.get(wildcards.device)
        if entry is not None and field in entry.model_fields_set:
            return getattr(entry, field)
        name = PLACEMENT[field]
        default = default_resource(name, "measure", wildcards, input, threads, attempt)
        return NO_REQUEST.get(name) if default is None else default

    return value


def measure_resources() -> dict[str, object]:
    """Resources of a measure job: measure.threads CPUs (the threads it times with), and the
    placement cluster.devices gives its device, for each field some device entry sets."""
    fields = {field for entry in SETTINGS.cluster.devices.values()
              for field in entry.model_fields_set}
    resources = {PLACEMENT[f]: device_placement(f) for f in PLACEMENT if f in fields}
    resources["cpus_per_task"] = SETTINGS.measure.threads
    return resources


def gpu_resources(device: str, gpus: int) -> dict[str, int]:
    """`gpu` for a job whose params device (auto | cpu | cuda) is `device`: `gpus` GPUs unless it
    is cpu (auto asks for them: on a node without a GPU it would silently train on the CPU)."""
    return {} if device == "cpu" else {"gpu": gpus}


def check_device_memory() -> None:
    """Refuse, before any job, a device that cannot hold a scale's largest arch at the largest
    condition (cluster.devices memory_gb; docs/measure.md). Only the devices this run measures
    are checked, so a plan without a memory_gb loads no torch."""
    stated = [d for d, entry in SETTINGS.cluster.devices.items()
              if entry.memory_gb is not None and d in MEASURED_DEVICES]
    if not stated:
        return
    from hwgptbench.campaign import plan
    from hwgptbench.settings.sections import MeasurePlanSettings

    settings = MeasurePlanSettings.of(SETTINGS)
    vocab_size = plan.tokenizer_vocab_size(settings.tokenizer)
    if vocab_size is None:  # a tokenizer file not written yet
        return
    memory = plan.cluster_memory(settings.cluster, settings.measure.aliases)
    devices = {scale: {d: memory[d] for d in stated if d not in published_tables(scale)}
               for scale in SCALES}
    try:
        plan.check_scales(plan.search_spaces(settings), settings.measure, vocab_size,
                         devices)
    except plan.MemoryPlanError as error:
        raise WorkflowError(f"measure plan refused: {error}") from None


check_device_memory()
