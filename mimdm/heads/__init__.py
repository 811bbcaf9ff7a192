"""The MI head: predicts the L x L MI matrix from one MDM forward pass; its inputs, loss and trainer."""
