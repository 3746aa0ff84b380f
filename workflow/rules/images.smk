# Container images: one per environment, built by docker or podman from docker/Dockerfile with
# the environment's lock, Python and base image, or pulled from a registry (config
# containers.images). results/images/{env}.json names the image, its id and digest: the cells
# of a container environment run that image (containers.runtime docker or podman), and rule sif
# makes an Apptainer image of it, or bootstraps one from the same base (docker/ptspeed.def)
# where there is no docker or podman. `snakemake images` builds or pulls them all.


include: "common_images.smk"


rule images:
    input:
        [image_manifest(env) for env in image_environments()],
    localrule: True


if CONTAINERS["images"] == "build":

    rule image:
        input:
            recipe="docker/Dockerfile",
            install="docker/install.sh",
            requirements=image_requirements,
        output:
            manifest=f"{RESULTS}/images/{{env}}.json",
        log:
            f"{RESULTS}/logs/images/{{env}}.log",
        benchmark:
            f"{RESULTS}/benchmarks/images/{{env}}.tsv"
        localrule: True
        conda:
            "../../envs/workflow.yaml"
        params:
            python=HOST_PYTHON,
            options=image_build_options,
        shell:
            "{params.python} scripts/image.py build --env {wildcards.env} {params.options}"
            " --requirements {input.requirements:q}"
            " --manifest {output.manifest:q} > {log:q} 2>&1"

else:

    rule image:
        output:
            manifest=f"{RESULTS}/images/{{env}}.json",
        log:
            f"{RESULTS}/logs/images/{{env}}.log",
        benchmark:
            f"{RESULTS}/benchmarks/images/{{env}}.tsv"
        localrule: True
        conda:
            "../../envs/workflow.yaml"
        params:
            python=HOST_PYTHON,
            options=image_pull_options,
        shell:
            "{params.python} scripts/image.py pull --env {wildcards.env} {params.options}"
            " --manifest {output.manifest:q} > {log:q} 2>&1"


rule sif:
    input:
        unpack(sif_inputs),
    output:
        sif=f"{RESULTS}/images/{{env}}.sif",
    log:
        f"{RESULTS}/logs/images/{{env}}-sif.log",
    benchmark:
        f"{RESULTS}/benchmarks/images/{{env}}-sif.tsv"
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        python=HOST_PYTHON,
        options=sif_options,
    shell:
        "{params.python} scripts/image.py sif --env {wildcards.env} {params.options}"
        " --requirements {input.requirements:q} --sif {output.sif:q} > {log:q} 2>&1"
