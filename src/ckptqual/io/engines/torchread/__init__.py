"""Reading and checking a torch.save archive without torch.load, one job per module.

`source` reads a file's bytes by offset; `records` reads its zip structure, every byte accounted for; `missing_end`
says why a file has no end record; `table` reads data.pkl without building tensors; `expected` checks an archive
against what its writer writes; `stored` lists any archive's tensors by file offset. A failure is a FormatError
(`findings`) whose one line names the record and what is wrong.
"""
