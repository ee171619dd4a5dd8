package netns

import "golang.org/x/sys/unix"

type fileStat = unix.Stat_t

func fstat(fd int, st *fileStat) error { return unix.Fstat(fd, st) }
