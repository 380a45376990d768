INSTALL= bash scripts/diag/s41_row1.sh stock  # command.sh of call1, without the install step
