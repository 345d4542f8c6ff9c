"""The runner's image work: FLUX.2-klein models run by mflux (docs/images.md). ``load`` builds
the pipeline from a checkpoint's files, ``denoise`` runs one image a denoising step at a time,
``engine`` is the ``Engine``/``Builder`` pair behind the runner's seam."""
