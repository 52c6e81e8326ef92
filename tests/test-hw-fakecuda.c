/* SPDX-License-Identifier: MIT
 *
 * tests/test-hw-fakecuda.c: a stand-in for libcuda.so.1 with the few
 * driver entry points discovery calls, so that the dlopen path is tested
 * on machines with no GPU.  $STOW_FAKE_CUDA_DEVICES sets the device count
 * (0: cuInit fails as the real driver does with no device).  Its devices
 * sit at the PCI addresses of tests/data/topology/dgx-h100-like.xml.
 */
#include <stdlib.h>
#include <string.h>

int cuInit (unsigned int flags);
int cuDeviceGetCount (int *count);
int cuDeviceGet (int *dev, int ordinal);
int cuDeviceGetName (char *name, int len, int dev);
int cuDeviceTotalMem_v2 (size_t *bytes, int dev);
int cuDeviceGetAttribute (int *value, int attr, int dev);
int cuDriverGetVersion (int *version);
int cuGetErrorString (int error, const char **text);

static int
devices (void)
{
  const char *v = getenv ("STOW_FAKE_CUDA_DEVICES");
  return v ? atoi (v) : 2;
}

int
cuInit (unsigned int flags)
{
  (void)flags;
  return devices () > 0 ? 0 : 100; /* CUDA_ERROR_NO_DEVICE */
}

int
cuDeviceGetCount (int *count)
{
  *count = devices ();
  return 0;
}

int
cuDeviceGet (int *dev, int ordinal)
{
  if (ordinal < 0 || ordinal >= devices ())
    return 101; /* CUDA_ERROR_INVALID_DEVICE */
  *dev = ordinal;
  return 0;
}

int
cuDeviceGetName (char *name, int len, int dev)
{
  (void)dev;
  strncpy (name, "NVIDIA H100 80GB HBM3", (size_t)len);
  name[len - 1] = '\0';
  return 0;
}

int
cuDeviceTotalMem_v2 (size_t *bytes, int dev)
{
  (void)dev;
  *bytes = (size_t)81090 << 20;
  return 0;
}

int
cuDeviceGetAttribute (int *value, int attr, int dev)
{
  switch (attr)
    {
    case 33: /* PCI bus: 0x18, 0x1a, ... like the XML's first socket */
      *value = 0x18 + 2 * dev;
      return 0;
    case 34: /* PCI device */
    case 50: /* PCI domain */
      *value = 0;
      return 0;
    case 75:
      *value = 9;
      return 0;
    case 76:
      *value = 0;
      return 0;
    default:
      return 1; /* CUDA_ERROR_INVALID_VALUE */
    }
}

int
cuDriverGetVersion (int *version)
{
  *version = 12040;
  return 0;
}

int
cuGetErrorString (int error, const char **text)
{
  *text = error == 100 ? "no CUDA-capable device is detected" : "unknown error";
  return 0;
}
