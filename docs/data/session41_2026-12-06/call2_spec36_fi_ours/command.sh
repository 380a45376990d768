INSTALL= bash scripts/diag/s41_row1.sh ours   # command.sh of call1, without the install step
