#include <diffuse/status.h>
int main(void) { return 0; }
