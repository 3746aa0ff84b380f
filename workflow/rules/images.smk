# Container images: one per environment, built by docker or podman from docker/Dockerfile with
# the environment's lock, Python and base image, or pulled from a registry by digest (config
# containers.images). results/images/{env}.json names the image, its id and digest. Under
# --use-singularity / --sdm apptainer, rule sif makes results/images/{env}.sif of it (or
# Apptainer builds it from docker/ptspeed.def where there is no docker or podman, or from the
# registry) and the cells of that environment run in it: the sif is their input, so a changed
# lock or recipe rebuilds exactly its image and reruns its cells. An image a site brings (kind
# image: a .sif, or a registry's by digest) is used as is: rule brought_image reads its torch,
# CUDA and GPU code from inside it once. `snakemake images` makes them all. A failed job prints
# its cause (the last line of its log: the script's error) and the log's path on the console.


include: "common_images.smk"


rule images:
    input:
        IMAGES.targets({cell.env for cell in CELLS}),
    localrule: True


if CONTAINERS.images == "build":

    rule image:
        input:
            recipe="docker/Dockerfile",
            install="docker/install.sh",
            uv="docker/uv.txt",
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
            "{params.python} workflow/scripts/image.py build --env {wildcards.env} {params.options}"
            " --requirements {input.requirements:q}"
            " --manifest {output.manifest:q} > {log:q} 2>&1"
            ' || {{ echo "ptspeed: $(tail -n 1 {log:q}) (log: {log})" >&2; exit 1; }}'

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
            "{params.python} workflow/scripts/image.py pull --env {wildcards.env} {params.options}"
            " --manifest {output.manifest:q} > {log:q} 2>&1"
            ' || {{ echo "ptspeed: $(tail -n 1 {log:q}) (log: {log})" >&2; exit 1; }}'


rule sif:
    input:
        unpack(sif_inputs),
    output:
        sif=f"{RESULTS}/images/{{env}}.sif",
        digest=f"{RESULTS}/images/{{env}}.sif.digest",
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
        "{params.python} workflow/scripts/image.py sif --env {wildcards.env} {params.options}"
        " --sif {output.sif:q} --digest {output.digest:q} > {log:q} 2>&1"
        ' || {{ echo "ptspeed: $(tail -n 1 {log:q}) (log: {log})" >&2; exit 1; }}'


# Only where some environment brings its image: its record is otherwise build_env's.
if BROUGHT_ENVS:

    rule brought_image:
        input:
            unpack(brought_image_input),
        output:
            record=environment_record_path(RESULTS, "{env}"),
            digest=f"{RESULTS}/envs/{{env}}.digest",
        log:
            f"{RESULTS}/logs/envs/{{env}}.log",
        benchmark:
            f"{RESULTS}/benchmarks/envs/{{env}}.tsv"
        wildcard_constraints:
            env=BROUGHT_ENV_PATTERN,
        localrule: True
        conda:
            "../../envs/workflow.yaml"
        params:
            python=HOST_PYTHON,
            image=lambda wildcards: REALISATION.brought(wildcards.env),
        shell:
            "{params.python} workflow/scripts/brought_image.py --env {wildcards.env} --image {params.image:q}"
            " --record {output.record:q} --digest {output.digest:q} > {log:q} 2>&1"
            ' || {{ echo "ptspeed: $(tail -n 1 {log:q}) (log: {log})" >&2; exit 1; }}'
