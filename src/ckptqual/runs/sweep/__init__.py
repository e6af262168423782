"""The read sweep: the cells of the matrix, the files it reads, and the driver of a cell."""
