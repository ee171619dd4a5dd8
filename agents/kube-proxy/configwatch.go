package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/fsnotify/fsnotify"
)

// errConfigFileChanged is upstream's reason to exit when the --config file is
// written or renamed: the agent restarts (its DaemonSet or unit restarts it) to
// read it again.
var errConfigFileChanged = errors.New("content of the proxy server's configuration file was updated")

// configWatcher watches the --config file, as upstream's options.initWatcher
// does with the same library.
type configWatcher struct {
	w *fsnotify.Watcher
}

// newConfigWatcher starts watching path; the caller must run or close it.
func newConfigWatcher(path string) (*configWatcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching config file %s: %w", path, err)
	}
	if err := w.Add(path); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("watching config file %s: %w", path, err)
	}
	return &configWatcher{w: w}, nil
}

// run returns errConfigFileChanged when the file is written or renamed, a
// watcher error as it comes, and nil when ctx ends. It closes the watcher.
func (cw *configWatcher) run(ctx context.Context) error {
	defer cw.w.Close()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-cw.w.Events:
			if !ok {
				return nil
			}
			if ev.Has(fsnotify.Write) || ev.Has(fsnotify.Rename) {
				return errConfigFileChanged
			}
		case err, ok := <-cw.w.Errors:
			if !ok {
				return nil
			}
			return err
		}
	}
}
