# Helpers of workflow/rules/images.smk: what an image is built from, and where it goes.


def image_environments():
    """Environments that have an image: built from a lock, or pulled by their reference."""
    needed = "requirements" if CONTAINERS["images"] == "build" else "container"
    return [env for env, spec in ENVIRONMENTS.items() if spec.get(needed)]


def image_requirements(wildcards):
    spec = ENVIRONMENTS[wildcards.env]
    if not spec.get("requirements"):
        raise WorkflowError(
            f"environments.{wildcards.env}: no requirements to build an image from"
        )
    return spec["requirements"]


def image_tag(env):
    """The built image's name: the environment's container reference, else a local name."""
    return ENVIRONMENTS[env].get("container") or f"localhost/ptspeed/{env}:latest"


def recipe_options(env):
    """Command-line options of scripts/image.py that say what an image is built from."""
    spec = ENVIRONMENTS[env]
    options = ["--python", spec["python"]]
    if spec.get("base_image"):
        options += ["--base-image", spec["base_image"]]
    if CONTAINERS["ca_bundle"]:
        options += ["--ca-bundle", Path(CONTAINERS["ca_bundle"]).expanduser().resolve()]
    return options


def image_build_options(wildcards):
    options = [
        "--engine",
        IMAGE_ENGINE,
        "--tag",
        image_tag(wildcards.env),
        *recipe_options(wildcards.env),
    ]
    return " ".join(shlex.quote(str(o)) for o in options)


def image_pull_options(wildcards):
    options = [
        "--engine",
        IMAGE_ENGINE,
        "--uri",
        ENVIRONMENTS[wildcards.env]["container"],
    ]
    return " ".join(shlex.quote(str(o)) for o in options)


def sif_source():
    """Rule sif converts the engine's image where the engine is here, else it bootstraps."""
    return "image" if shutil.which(IMAGE_ENGINE) else "definition"


def sif_inputs(wildcards):
    inputs = {
        "requirements": image_requirements(wildcards),
        "install": "docker/install.sh",
    }
    if sif_source() == "image":
        return {**inputs, "manifest": image_manifest(wildcards.env)}
    return {**inputs, "definition": "docker/ptspeed.def"}


def sif_options(wildcards):
    options = recipe_options(wildcards.env)
    if sif_source() == "image":
        options += [
            "--engine",
            IMAGE_ENGINE,
            "--manifest",
            image_manifest(wildcards.env),
        ]
    return " ".join(shlex.quote(str(o)) for o in options)
