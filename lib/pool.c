/*
 * pool.c - placeholder; its owner replaces this file.
 */
#include "internal.h"
