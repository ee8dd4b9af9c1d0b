"""Loading and unloading LoRA adapters at run time (vLLM's /v1/load_lora_adapter and
/v1/unload_lora_adapter): admin keys only, adapters only from the configured roots."""

from gateway.apis.lora_adapters.router import router
from gateway.http.api import Api

API = Api("lora_adapters", router)
