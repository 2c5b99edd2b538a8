"""Reading dumps: aligner's own (`source`: manifest + .npy, or a plain folder of .npy files), other tools'
(`foreign`: msprobe, MindSpore's native dump) and multi-rank dumps' rank folders (`ranks`). Every pipeline that reads
a dump imports these modules; none reads one another way."""
