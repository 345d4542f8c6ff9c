"""Images in the API families: each family's image shapes read into ``ImageRef``s, and the
check that the model asked takes images (docs/api.md "Images")."""
