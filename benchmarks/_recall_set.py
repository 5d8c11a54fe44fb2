"""The long-conversation memory set of `benchmarks/recall.py` (written for agentmem, issue #34).

Each `Fact` is a sentence a user states early in a long conversation, asked about later twice:
`paraphrase` by meaning (it shares no content word with the fact: "which boat carried the cargo
out of the Dutch port?" for "the shipment left Rotterdam harbor aboard the vessel Nordlys") and
`keyword` by a distinctive word of the fact (the question a full-text search was built for).
`FILLER` is small talk of the same conversation that states none of the facts; it stands for the
rest of the evicted history, so a search must pick one span among many.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FACTS", "FILLER", "Fact"]


@dataclass(frozen=True)
class Fact:
    """One fact and the two questions that should recall it."""

    text: str
    paraphrase: str
    keyword: str


FACTS: tuple[Fact, ...] = (
    Fact("The shipment left Rotterdam harbor aboard the vessel Nordlys on Tuesday.",
         "Which boat carried the cargo out of the Dutch port?", "What about Nordlys?"),
    Fact("My sister Ingrid is allergic to peanuts, so the wedding caterer must avoid them.",
         "What food can't my sibling eat at the marriage celebration?", "What is Ingrid allergic to?"),
    Fact("The staging database password was rotated and now lives in the Vault path secret/stage/db.",
         "Where do we keep the credentials for the test environment's data store?", "Which Vault path?"),
    Fact("Our quarterly revenue came in at 4.2 million euros, up eleven percent.",
         "How much money did the company earn in the last three months?", "What was the quarterly revenue?"),
    Fact("The dentist appointment was moved to Thursday at half past three.",
         "When do I see the tooth doctor now?", "When is the dentist appointment?"),
    Fact("I parked the car on level four of the airport garage, row K.",
         "Where did I leave my automobile at the terminal?", "Which garage row?"),
    Fact("Grandma's lasagna recipe uses nutmeg in the bechamel sauce.",
         "What spice goes into the white sauce of the old family pasta dish?", "What goes in the bechamel?"),
    Fact("The production outage was caused by an expired TLS certificate on the load balancer.",
         "Why did the live site go down?", "What about the TLS certificate?"),
    Fact("Marco prefers to be contacted on Signal rather than by email.",
         "How does our Italian colleague like people to reach him?", "How do I reach Marco?"),
    Fact("The lease on the Berlin office ends in March and the landlord wants a ten percent increase.",
         "When does our rental agreement for the German workplace expire?", "When does the Berlin lease end?"),
    Fact("Our cat Miso needs her thyroid pills twice a day with food.",
         "How often does the pet take its medication?", "What pills does Miso take?"),
    Fact("The conference keynote will be delivered by Dr. Amara Okafor on climate adaptation.",
         "Who is giving the main talk at the event?", "Who gives the keynote?"),
    Fact("We chose PostgreSQL over MongoDB because the reporting team needs joins.",
         "Why did we pick that relational store instead of the document one?", "Why PostgreSQL?"),
    Fact("The hiking trail to the glacier is closed after the rockslide near the second bridge.",
         "Can we still walk up to the ice field?", "Is the glacier trail open?"),
    Fact("My passport expires in June, so I must renew it before the Japan trip.",
         "Is my travel document still valid for the journey to Tokyo?", "When does my passport expire?"),
    Fact("The build breaks on ARM because the vendored zstd library lacks NEON detection.",
         "Why does compilation fail on those Apple-style processors?", "What about the zstd library?"),
    Fact("Lena's birthday party is at the bowling alley on Saturday at six.",
         "Where is the celebration for her turning a year older?", "Where is Lena's party?"),
    Fact("The invoice from Kestrel Logistics is overdue by forty-five days.",
         "Which supplier bill hasn't been paid on time?", "What about Kestrel?"),
    Fact("I switched my mortgage to a fixed rate of 3.1 percent for ten years.",
         "What interest am I paying on the home loan now?", "What is my mortgage rate?"),
    Fact("The new intern, Priya, starts on Monday and will shadow the data science group.",
         "Who is the trainee joining us next week?", "When does Priya start?"),
    Fact("The printer on the third floor jams whenever you use the heavy cardstock.",
         "Which office machine has trouble with thick paper?", "Which printer jams?"),
    Fact("We agreed to ship version 2.0 without the offline mode; it moves to 2.1.",
         "Which feature was cut from the upcoming major release?", "What moved to 2.1?"),
    Fact("My blood pressure reading this morning was 128 over 84.",
         "What were my heart measurements when I woke up?", "What was my blood pressure?"),
    Fact("The garden hose splitter is stored in the blue bin behind the shed.",
         "Where is the watering attachment kept outside?", "Where is the hose splitter?"),
    Fact("Tomas cancelled his subscription because the annual price doubled.",
         "Why did that customer stop paying for our service?", "Why did Tomas cancel?"),
    Fact("The vaccine for the dog is due again in October at the Riverside clinic.",
         "When does the puppy need its next shot?", "When is the vaccine due?"),
    Fact("Our flight to Lisbon departs from gate B22 at 07:40.",
         "Where does the plane to Portugal leave from?", "Which gate for Lisbon?"),
    Fact("The kitchen renovation budget is capped at eighteen thousand dollars.",
         "How much can we spend redoing the cooking area?", "What is the renovation budget?"),
    Fact("The API rate limit is 600 requests per minute per key.",
         "How many calls can each client make before being throttled?", "What is the rate limit?"),
    Fact("I left the spare house key with the neighbour, Mrs. Alvarez, at number 12.",
         "Who has the extra way into my home?", "Who has the spare key?"),
    Fact("The chemistry exam covers chapters five through nine, mostly organic reactions.",
         "What material will the science test include?", "What does the chemistry exam cover?"),
    Fact("My running coach wants me at 45 kilometers a week before the marathon.",
         "What distance should I train each week ahead of the big race?", "How many kilometers for the marathon?"),
    Fact("The board approved hiring three more support engineers in the Manila office.",
         "How many helpdesk staff can we add in the Philippines?", "How many engineers in Manila?"),
    Fact("The wine we loved in Porto was a 2017 Douro red called Quinta do Vale.",
         "What was that bottle we enjoyed in Portugal?", "Which Douro wine?"),
    Fact("Jakub is allergic to penicillin and carries an epinephrine pen.",
         "Which antibiotic must the doctors never give him?", "What is Jakub allergic to?"),
    Fact("The solar panels produced 14 kilowatt hours yesterday despite the clouds.",
         "How much power did the roof generate the day before?", "How much did the solar panels produce?"),
    Fact("The podcast interview with Hannah is recorded next Wednesday in studio C.",
         "When do we tape the audio show conversation?", "When is the podcast recorded?"),
    Fact("The bike's rear derailleur needs a new cable; the shop quoted 35 dollars.",
         "What will it cost to fix the gear shifting on my bicycle?", "What about the derailleur?"),
    Fact("Ahmed's flight lands at Heathrow at 9 pm, terminal five.",
         "When does he arrive in London?", "When does Ahmed land?"),
    Fact("The server room thermostat is set to 19 degrees Celsius.",
         "How cold do we keep the machine closet?", "What is the thermostat set to?"),
    Fact("My library books are due back on the 14th or I pay a fine.",
         "When must I return what I borrowed to avoid a penalty?", "When are the library books due?"),
    Fact("The vendor contract with Bluefin Analytics auto-renews unless cancelled thirty days ahead.",
         "How much notice do we need to give to end that supplier agreement?", "What about Bluefin?"),
    Fact("The piano tuner comes every six months; the last visit was in April.",
         "How often does someone adjust the instrument's strings?", "When did the piano tuner come?"),
    Fact("Our daughter's school uniform is navy blazer with a grey skirt.",
         "What does the kid wear to class?", "What is the school uniform?"),
    Fact("The elevator in building A is out of service until the part arrives from Finland.",
         "Why can't we take the lift in the first block?", "When is the elevator fixed?"),
    Fact("My tax return was filed on April 2nd and the refund is 1,340 dollars.",
         "How much is the government paying me back this year?", "How big is my tax refund?"),
    Fact("The refund for order PO-88213 was approved by finance this morning.",
         "Did accounting sign off on giving that customer their money back?", "What happened to PO-88213?"),
    Fact("The regression was introduced in commit 3f9a2c1 by the caching change.",
         "Which code change made things worse again?", "What about 3f9a2c1?"),
    Fact("Support ticket ZD-4471 is about customers double charged in the checkout.",
         "Which helpdesk case covers people billed twice when paying?", "What is ZD-4471 about?"),
    Fact("The warehouse door code is 7391, changed last Friday.",
         "What number opens the storage building's entrance?", "What is 7391?"),
    Fact("The nightly backup job runs from host db-replica-03 at 02:15 UTC.",
         "Which machine copies our records every night?", "What runs on db-replica-03?"),
    Fact("Tracking number 1Z999AA10123456784 belongs to the parcel with the replacement monitor.",
         "How can I follow the delivery of the new screen?", "What is 1Z999AA10123456784?"),
)
"""52 facts, each with a paraphrased and a keyword question (the last six asked by an identifier)."""

FILLER: tuple[str, ...] = (
    "Thanks, that makes sense. Let me think about it for a moment.",
    "Sure, I can help with that. Do you want a short summary or the details?",
    "It rained most of the afternoon so we stayed in and watched a film.",
    "Could you rewrite that paragraph so it sounds a little less formal?",
    "Honestly I am not sure yet; I will check with the others and come back to you.",
    "The weather forecast says it will be sunny for the rest of the week.",
    "Here is a list of ideas: a picnic, a museum visit, or a long walk by the river.",
    "That is a good point. We should keep the plan simple and revisit it later.",
    "Can you explain the difference between a list and a tuple in Python?",
    "A list is mutable while a tuple is immutable, so tuples can be dictionary keys.",
    "I have been reading a novel about a lighthouse keeper on a remote island.",
    "Remind me to drink more water; I keep forgetting during long meetings.",
    "The meeting went fine, nothing special to report apart from the usual updates.",
    "Let's draft the email together: start with a friendly greeting and the main ask.",
    "I tried a new coffee place downtown; the pastries were better than the coffee.",
    "What are some good stretches for a stiff neck after a day at the desk?",
    "Try slow neck rotations, shoulder rolls and a chin tuck, holding each for a few breaths.",
    "We talked about weekend plans but did not decide anything in the end.",
    "Please format the table with the totals in the last column.",
    "My phone battery drains quickly lately; maybe an app is misbehaving.",
    "The movie was long but the soundtrack was wonderful.",
    "Could you suggest a name for a small team newsletter?",
    "How about 'The Weekly Byte' or 'Notes from the Team'?",
    "I need to clean the apartment before guests arrive on the weekend.",
)
"""Small talk between the facts: the rest of the evicted history."""
