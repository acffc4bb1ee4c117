// The `hslide` command (placeholder until the CLI lands).
#include <cstdio>
int main() { std::puts("hslide"); return 0; }
