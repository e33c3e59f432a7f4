"""Room templates and object choices for the offline ALFWorld generator.

Receptacle/object compatibilities come from alfworld's own ALFRED constants
(``alfworld.gen.constants.VAL_RECEPTACLE_OBJECTS`` and ``VAL_ACTION_OBJECTS``), so a generated game only
asks for placements ALFRED itself allows. The room templates mirror the four ALFRED scene kinds
(kitchen FloorPlan1-30, living room 201-230, bedroom 301-330, bathroom 401-430).

The ``train``, ``valid_seen`` and ``valid_unseen`` splits all draw their rooms from those four templates
(:data:`ROOMS_FOR_TASK`); only the generator seed differs. ``valid_unseen_templates`` draws from
:data:`HELD_OUT_ROOMS_FOR_TASK` instead: three more templates (studio, ensuite, den; floor plans 501-530,
601-630, 701-730) built from the same receptacle and object classes, but each joins two always-present
receptacle classes that no training template holds together (a bed beside a fridge, a bed beside a toilet, a
desk beside a sofa), so no training room, of any seed, has the receptacle composition of a held-out room.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The six ALFWorld task types (``traj_data["task_type"]``), keyed by the names used in our env ids.
TASK_TYPES: dict[str, str] = {
    "PickAndPlace": "pick_and_place_simple",
    "PickTwoAndPlace": "pick_two_obj_and_place",
    "LookAtInLight": "look_at_obj_in_light",
    "PickCleanAndPlace": "pick_clean_then_place_in_recep",
    "PickHeatAndPlace": "pick_heat_then_place_in_recep",
    "PickCoolAndPlace": "pick_cool_then_place_in_recep",
}

#: Receptacle classes that open and close (ALFRED's ``OPENABLE_CLASS_LIST`` minus the movable Box).
OPENABLE = frozenset({"Fridge", "Cabinet", "Microwave", "Drawer", "Safe"})


@dataclass(frozen=True)
class RoomTemplate:
    """A scene kind: receptacle classes with (min, max) counts; the always-present ones have min >= 1."""

    name: str
    scene_base: int
    receptacles: tuple[tuple[str, int, int], ...]
    objects: tuple[str, ...]


KITCHEN = RoomTemplate(
    "kitchen",
    0,
    (
        ("Cabinet", 2, 8),
        ("CounterTop", 1, 3),
        ("Drawer", 1, 6),
        ("Fridge", 1, 1),
        ("Microwave", 1, 1),
        ("SinkBasin", 1, 1),
        ("StoveBurner", 2, 4),
        ("GarbageCan", 1, 1),
        ("CoffeeMachine", 0, 1),
        ("Toaster", 0, 1),
        ("DiningTable", 0, 1),
        ("Shelf", 0, 3),
    ),
    (
        "Apple", "Bread", "Egg", "Lettuce", "Potato", "Tomato", "Mug", "Cup", "Bowl", "Plate", "Pan", "Kettle",
        "Fork", "Spoon", "Knife", "ButterKnife", "Spatula", "Ladle", "DishSponge", "SaltShaker",
        "PepperShaker", "SoapBottle", "WineBottle", "Glassbottle", "PaperTowel",
    ),
)

LIVINGROOM = RoomTemplate(
    "livingroom",
    200,
    (
        ("Sofa", 1, 1),
        ("ArmChair", 0, 2),
        ("CoffeeTable", 1, 1),
        ("SideTable", 1, 2),
        ("TVStand", 0, 1),
        ("Cabinet", 0, 4),
        ("Drawer", 1, 4),
        ("Dresser", 0, 1),
        ("Shelf", 0, 3),
        ("GarbageCan", 1, 1),
        ("Safe", 0, 1),
    ),
    (
        "Book", "Box", "CellPhone", "CreditCard", "KeyChain", "Laptop", "Newspaper", "Pillow",
        "RemoteControl", "Statue", "Vase", "Watch", "TissueBox", "Candle", "Cloth",
    ),
)

BEDROOM = RoomTemplate(
    "bedroom",
    300,
    (
        ("Bed", 1, 1),
        ("Desk", 0, 1),
        ("SideTable", 1, 2),
        ("Drawer", 1, 6),
        ("Dresser", 0, 1),
        ("Shelf", 0, 4),
        ("GarbageCan", 1, 1),
        ("LaundryHamper", 0, 1),
        ("Safe", 0, 1),
        ("ArmChair", 0, 1),
    ),
    (
        "AlarmClock", "BaseballBat", "BasketBall", "Book", "CD", "CellPhone", "CreditCard", "KeyChain",
        "Laptop", "Pillow", "Pencil", "TennisRacket", "Watch", "Mug", "Cloth", "Bowl",
    ),
)

BATHROOM = RoomTemplate(
    "bathroom",
    400,
    (
        ("SinkBasin", 1, 2),
        ("CounterTop", 1, 1),
        ("Cabinet", 1, 4),
        ("Drawer", 0, 4),
        ("Toilet", 1, 1),
        ("TowelHolder", 0, 1),
        ("HandTowelHolder", 0, 1),
        ("ToiletPaperHanger", 1, 1),
        ("GarbageCan", 1, 1),
        ("Shelf", 0, 2),
    ),
    (
        "SoapBar", "SoapBottle", "Cloth", "DishSponge", "HandTowel", "Candle", "SprayBottle",
        "ToiletPaper", "TissueBox", "PaperTowel", "Plunger",
    ),
)

#: Held-out templates (``split="valid_unseen_templates"``): a studio flat (bed, sofa and a kitchenette).
STUDIO = RoomTemplate(
    "studio",
    500,
    (
        ("Bed", 1, 1),
        ("Sofa", 1, 1),
        ("SideTable", 1, 2),
        ("Fridge", 1, 1),
        ("Microwave", 1, 1),
        ("CounterTop", 1, 2),
        ("SinkBasin", 1, 1),
        ("Cabinet", 1, 4),
        ("Drawer", 1, 3),
        ("GarbageCan", 1, 1),
        ("Shelf", 0, 2),
        ("CoffeeTable", 0, 1),
        ("Desk", 0, 1),
    ),
    (
        "Apple", "Bread", "Egg", "Potato", "Tomato", "Mug", "Cup", "Bowl", "Plate", "Pan", "Fork", "Spoon",
        "DishSponge", "Book", "CellPhone", "Laptop", "Pillow", "KeyChain", "CreditCard", "RemoteControl",
        "AlarmClock", "Cloth", "Watch",
    ),
)

#: Held-out: a bedroom with an en-suite bathroom (bed and toilet in one room).
ENSUITE = RoomTemplate(
    "ensuite",
    600,
    (
        ("Bed", 1, 1),
        ("SideTable", 1, 2),
        ("Dresser", 0, 1),
        ("Desk", 0, 1),
        ("Drawer", 1, 4),
        ("Toilet", 1, 1),
        ("SinkBasin", 1, 1),
        ("CounterTop", 0, 1),
        ("Cabinet", 0, 2),
        ("ToiletPaperHanger", 1, 1),
        ("TowelHolder", 0, 1),
        ("GarbageCan", 1, 1),
        ("Shelf", 0, 2),
    ),
    (
        "AlarmClock", "Book", "CellPhone", "CreditCard", "KeyChain", "Laptop", "Pillow", "Pencil", "Watch", "Mug",
        "Cloth", "SoapBar", "SoapBottle", "Candle", "TissueBox", "SprayBottle", "ToiletPaper", "HandTowel",
    ),
)

#: Held-out: a den (a study with a sofa: desk and sofa in one room).
DEN = RoomTemplate(
    "den",
    700,
    (
        ("Desk", 1, 1),
        ("Sofa", 1, 1),
        ("ArmChair", 0, 2),
        ("CoffeeTable", 0, 1),
        ("SideTable", 1, 2),
        ("Shelf", 1, 4),
        ("Drawer", 1, 4),
        ("Cabinet", 0, 3),
        ("Dresser", 0, 1),
        ("GarbageCan", 1, 1),
        ("Safe", 0, 1),
    ),
    (
        "Book", "Box", "CellPhone", "CreditCard", "KeyChain", "Laptop", "Newspaper", "Pillow", "RemoteControl",
        "Statue", "Vase", "Watch", "TissueBox", "Candle", "AlarmClock", "CD", "Pencil", "Mug",
    ),
)

#: Rooms each task type can be generated in (heat/cool need the kitchen's microwave/fridge).
ROOMS_FOR_TASK: dict[str, tuple[RoomTemplate, ...]] = {
    "pick_and_place_simple": (KITCHEN, LIVINGROOM, BEDROOM, BATHROOM),
    "pick_two_obj_and_place": (KITCHEN, LIVINGROOM, BEDROOM, BATHROOM),
    "look_at_obj_in_light": (LIVINGROOM, BEDROOM),
    "pick_clean_then_place_in_recep": (KITCHEN, BATHROOM),
    "pick_heat_then_place_in_recep": (KITCHEN,),
    "pick_cool_then_place_in_recep": (KITCHEN,),
}

#: Rooms of the ``valid_unseen_templates`` split: templates no other split draws (heat/cool need the studio's
#: microwave/fridge, clean a sink basin).
HELD_OUT_ROOMS_FOR_TASK: dict[str, tuple[RoomTemplate, ...]] = {
    "pick_and_place_simple": (STUDIO, ENSUITE, DEN),
    "pick_two_obj_and_place": (STUDIO, ENSUITE, DEN),
    "look_at_obj_in_light": (STUDIO, ENSUITE, DEN),
    "pick_clean_then_place_in_recep": (STUDIO, ENSUITE),
    "pick_heat_then_place_in_recep": (STUDIO,),
    "pick_cool_then_place_in_recep": (STUDIO,),
}

#: Where a desk lamp may stand in a look_at_obj_in_light game.
LAMP_HOLDERS = ("SideTable", "Desk", "Dresser")

#: Receptacles that are never goals (they hold one object class, or are an appliance used by the task).
NEVER_GOAL = frozenset({"TowelHolder", "HandTowelHolder", "ToiletPaperHanger", "StoveBurner", "Toaster",
                        "CoffeeMachine", "LaundryHamper", "TVStand"})


def has_prefix_clash(names: set[str]) -> bool:
    """True if one lowercase class name is a strict prefix of another (e.g. ``pen``/``pencil``).

    alfworld's handcoded expert matches objects with substring tests such as ``"take pen" in command``,
    which would confuse ``pen 1`` with ``pencil 1``; the generator never puts such a pair in one room.
    """
    low = sorted(n.lower() for n in names)
    return any(b != a and b.startswith(a) for i, a in enumerate(low) for b in low[i + 1 :])
