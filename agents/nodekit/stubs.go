package main

func runUp(args []string) (int, error)        { return exitError, errUsage }
func runDown(args []string) (int, error)      { return exitError, errUsage }
func runStatus(args []string) (int, error)    { return exitError, errUsage }
func runLoad(args []string) (int, error)      { return exitError, errUsage }
func runSupervise(args []string) (int, error) { return exitError, errUsage }
func defaultStateKubeconfig() string          { return "" }
